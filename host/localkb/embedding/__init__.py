"""The embedding model: its verified files, the ONNX embedders, and the build of our own int8 variant."""
