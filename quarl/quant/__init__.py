"""Quantization numerics: precisions (`precision`, JAX-free), uniform int quantization and low-precision casts of
parameter trees (`quantization`), the same on an accelerator (`device`), sub-byte packing (`bitpack`), calibrated
activation ranges for int conv actors (`calibration`), error metrics (`metrics`), and the weight payload actors
receive (`payload`, its leaves in `wire`)."""
