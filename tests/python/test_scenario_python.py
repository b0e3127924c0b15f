"""Every shared scenario (`tests/scenarios/*.json`) run with the Python API:
the steps run and their expectations hold (`scenario_runner.py`)."""

import pytest

from support.scenario_files import IDS, SCENARIOS
from support.scenario_runner import python_record

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")


@pytest.mark.parametrize("scenario", SCENARIOS, ids=IDS)
def test_scenario_python(scenario, tmp_path_factory):
    python_record(scenario, tmp_path_factory)
