"""The model family's members, by name (no dependencies: the device check reads it too)."""

FAMILY = ("target", "draft_small", "draft_base", "draft_large", "draft_distilled",
          "draft_small_kd", "draft_shared_enc", "draft_shared_enc_long",
          "draft_shared_enc_signals", "draft_shared_enc_d192")
DRAFTS = FAMILY[1:]
# Members that read the target's encoder (`models.shared_encoder`; TrainConfig.student =
# "shared_encoder" in their training config).
SHARED_ENCODER = ("draft_shared_enc", "draft_shared_enc_long", "draft_shared_enc_signals",
                  "draft_shared_enc_d192")
# Decoder-only drafts of a GGUF target (`models.llama.student`: they read the target's
# embedding; the _eagle one its features too), shipped beside the family in the same folder.
GGUF_DRAFTS = ("draft_smollm2", "draft_smollm2_eagle")
