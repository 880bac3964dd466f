"""GGUF -> ONNX builder (numpy + onnx only)."""
