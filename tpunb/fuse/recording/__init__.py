"""Recording: how an op on the notebook thread becomes a node of the scope's trace instead of
running at once (docs/engine.md, "An op's walk"): the wrapper tensor, what is known of each op,
reading its arguments, its outputs' metadata, the known path for repeated steps, the ops that
run at once (eager, settled, growing inputs), adopted parameters and optimizer state, and the
random streams kept as eager's."""
