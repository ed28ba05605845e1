"""What tflgpu knows about ops, whatever runs them: attributes and their TFLite conventions (padding,
activations, resize scales, slices), quantization parameters, custom-op options, the BHWC mapping of
shapes, the context a kernel is prepared in, and one table of op traits that the passes, the float view,
the unroller, the constant folder and both backends read. Nothing here computes an op."""
