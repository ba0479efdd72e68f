"""Model readers. Only ONNX for now; parsed by nncc itself, without the onnx package."""
