"""Live Ray Serve run of the cluster routers (``python -m benchmarks.ray_live``)."""
