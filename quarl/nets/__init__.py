"""What the learner trains: a `PolicySpec` as a haiku network (`haiku`), and quantization-aware training layers
that compute as the int-B actors do (`qat`)."""
