"""Developer tooling, not the runtime: the NVRTC binding and ``cotsdl check-kernels``.

Nothing of the training or evaluation path imports this package.  (The CPU
emulator of the kernels, :mod:`cotsdl.cudaemu`, stays a runtime package: it *is* the
``cuda-emu`` backend, and imports nothing of cotsdl.)
"""
