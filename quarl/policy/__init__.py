"""Policy descriptions shared by learners and actors: `PolicySpec` and its layers (`spec`), the float64 NumPy
forward every runtime is tested against (`reference`), and the one im2col the JAX runtime and QAT share (`im2col`).
Plain data and NumPy: an actor reads a spec without importing haiku or JAX."""
