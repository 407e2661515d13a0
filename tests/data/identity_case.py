"""Run by tests/test_spec_forms.py: reports what each rank actually imported and would construct."""

import os


def what_runs():
    import deepspeed
    from deepspeed.runtime.zero import parameter_offload

    cls = parameter_offload.PartitionedParameterCoordinator
    return os.path.dirname(deepspeed.__file__), f"{cls.__module__}.{cls.__qualname__}"


def test_identity(zero3_world):
    paths = zero3_world.run(what_runs)
    print("IDENTITY", paths[0][0], paths[0][1])
    assert paths[0] == paths[1]
