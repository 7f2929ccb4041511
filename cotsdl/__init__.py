"""cotsdl: large locally-connected sparse autoencoders trained by model parallelism over MPI.

A reproduction of Coates et al., "Deep learning with COTS HPC systems" (ICML 2013).
"""
__version__ = "0.1.0"
