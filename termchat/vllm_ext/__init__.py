"""What vLLM itself loads into its processes, apart from the front-end's engine
management: the plugin (plugin.py), the quantization methods (int4.py, ggml.py),
the GGUF reader the loader and `models add` share (gguf_file.py), and the ggml
operator's C++ source and its build (ggml_op.cpp, build.py). Nothing here
imports the rest of termchat."""
