"""Array backends (numpy, opencl, cuda) and the model families that run on them."""
