import pathlib

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]


def pytest_addoption(parser):
    parser.addoption("--device", default="cpu",
                     help="where the model runs: cpu (CI) or cuda (the GPU machine)")


@pytest.fixture(scope="session")
def device(request):
    return request.config.getoption("--device")


@pytest.fixture(scope="session")
def root():
    return ROOT


@pytest.fixture(scope="session")
def model_path():
    return ROOT / "models" / "painn-gfn2.safetensors"
