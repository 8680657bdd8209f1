"""Acting: the environment stepper, K environments through one batched policy call into a sink (`loop`), and
agent-agnostic greedy evaluation of a (quantized) policy (`evaluation`)."""
