"""The T5 regime map: where speculative decoding pays for the public T5 shapes.

`sweep` measures every cost of the cost model on random-weight models of each shape,
`regime_rows` reads and writes its rows, `regime_predictions` prices each pair with the
cost model and holds the predictions against our measured family, `regime_figure` draws
the map. `python -m experiments.regime_map` is its command.
"""
