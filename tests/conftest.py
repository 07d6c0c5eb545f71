import os

import pytest

DATA = os.path.join(os.path.dirname(__file__), "data")
ORACLE = os.path.join(DATA, "oracle", "scenarios")
SPEC_ORACLE = os.path.join(DATA, "oracle", "spec_scenarios")


@pytest.fixture
def oracle_dir():
    return ORACLE
