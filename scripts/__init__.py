"""The operational pieces beside the product: the local teacher, the fixtures' builder, the GPU smoke checks, the
GPU resolve check and the configuration reference's generator.

Those that import the project run from the repository root as modules, e.g. `python -m scripts.serve_local_teacher`.
"""
