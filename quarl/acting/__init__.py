"""Acting: the loop that steps K environments through one batched policy call into n-step adders (`loop`), and
agent-agnostic greedy evaluation of a (quantized) policy (`evaluation`)."""
