"""The ActorQ node classes (no Ray here: `launch.program.ray_runner` wraps them in Ray actors,
`launch.program.local_runner` calls them directly): actor (replay) and rollout actor (on-policy), learner (+ its
publisher and batch feed),
evaluator, the services (counter, replay, weight server), the weights client and what they share."""
