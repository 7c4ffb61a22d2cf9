"""The costs a speculative decoder pays, measured, and the choices made from them.

`timing` is the one module that times decoders and their parts (the target's T_verify(k),
the draft's proposals, both loops' own work, the encoders; a whole measured point,
`timing.time_point`; gamma = 'auto''s calibration, `timing.choose_gamma`); `loop_work`
fits the loops' own work from those times, each term >= 0; `gamma_choice` and
`tree_choice` choose gamma and a token tree's shape as pure functions of the measured
times (`specdec_jax.theory` holds the cost model they price with); `profiling` accounts
for a compiled loop's time op by op. Every timing runs inside the caller's guard
(`specdec_jax.contention`).
"""
