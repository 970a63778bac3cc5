import os

from hypothesis import HealthCheck, settings

settings.register_profile("ci", deadline=None, suppress_health_check=[HealthCheck.too_slow], print_blob=True)
settings.register_profile("thorough", parent=settings.get_profile("ci"), max_examples=2000)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))


# `make test` runs the suite on two xdist workers (--dist loadgroup). The tests that create or list network
# namespaces (and the README examples that run on a shaped network) check the machine's whole set of namespaces,
# and the Ray tests start a local cluster: each group runs on one worker, one test after another.
_SERIAL_GROUPS = {
    "tests/runtime/test_netns.py": "netns",
    "tests/runtime/test_cli_run.py": "netns",
    "tests/test_readme.py": "netns",
    "tests/execute/test_ray.py": "ray",
}


def pytest_collection_modifyitems(config, items):
    import pytest

    root = config.rootpath
    for item in items:
        group = _SERIAL_GROUPS.get(item.path.relative_to(root).as_posix())
        if group is not None:
            item.add_marker(pytest.mark.xdist_group(group))
