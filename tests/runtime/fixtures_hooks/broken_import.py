"""A hook module whose own dependency is missing (the module exists, its import fails)."""

import slime_package_that_does_not_exist  # noqa: F401


def reward(sample):
    return 0.0
