"""The kinds of target a run measures: `interface` (what a kind implements), `registry`
(the kinds by name, and their checks), `t5_target` and `llama_target` (the two kinds), and
the shipped T5 family (`family`: its members by name; `stand_ins`: random-weight models
for a run without the shipped ones)."""
