"""The distributed ActorQ program: the graph of nodes one experiment becomes (`actorq_graph`), the nodes themselves
(`nodes`: actors, learner, evaluator, replay and weight services), and the supervisor that runs the graph on a
runner (`launch.program`: threads in one process, or Ray), restarts lost actors and writes summary.json."""
