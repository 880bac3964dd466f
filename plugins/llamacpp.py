"""llama.cpp's samplers: DRY, XTC, top-n-sigma and mirostat v2."""
