"""Settings registry: parsing, precedence and refusal of bad values."""

from __future__ import annotations

import pytest

from bonsai_launch.config.settings import BY_ENV, SETTINGS, parse_value, resolve
from bonsai_launch.core.errors import BonsaiError


@pytest.mark.parametrize("word", ["1", "true", "TRUE", "Yes", "on", "ON"])
def test_true_words(word):
    assert resolve(env={"BONSAI_SPECULATIVE": word})["speculative"] is True


@pytest.mark.parametrize("word", ["0", "false", "False", "NO", "off"])
def test_false_words(word):
    assert resolve(env={"BONSAI_KV4": word})["kv4"] is False


def test_empty_variable_means_unset():
    assert resolve(env={"BONSAI_CTX": ""}).source("ctx") == "default"


def test_precedence_flag_env_profile_default():
    assert resolve({"ctx": 1024}, {"BONSAI_CTX": "2048"}, {"ctx": 4096}).source("ctx") == "flag"
    assert resolve({}, {"BONSAI_CTX": "2048"}, {"ctx": 4096})["ctx"] == 2048
    assert resolve({}, {}, {"ctx": 4096}).source("ctx") == "profile"
    assert resolve({}, {}, {}).source("ctx") == "default"


def test_choices_are_case_insensitive_and_canonical():
    assert resolve(env={"BONSAI_MODEL": "27b"})["size"] == "27B"
    assert resolve(env={"BONSAI_FAMILY": "Ternary"})["family"] == "ternary"


def test_error_names_variable_value_and_allowed():
    with pytest.raises(BonsaiError) as err:
        resolve(env={"BONSAI_CTX": "lots"})
    text = str(err.value)
    assert "BONSAI_CTX='lots'" in text and "whole number from 0 to" in text
    assert err.value.exit_code == 2


def test_flag_errors_name_the_flag():
    with pytest.raises(BonsaiError, match=r"--port=70000"):
        resolve({"port": 70000})


def test_every_setting_is_documented_and_typed():
    for s in SETTINGS:
        assert s.env.startswith("BONSAI_") and s.description and s.commands
        if s.kind == "int":
            assert s.minimum is not None and s.maximum is not None
        if s.kind == "choice":
            assert s.choices
    assert len(BY_ENV) == len(SETTINGS)


def test_reference_variables_exist():
    reference = {
        "BONSAI_FAMILY",
        "BONSAI_MODEL",
        "BONSAI_TOKEN",
        "BONSAI_HOST",
        "BONSAI_CTX",
        "BONSAI_NGL",
        "BONSAI_IMAGE_MAX_TOKENS",
        "BONSAI_MMPROJ_CPU",
        "BONSAI_SPECULATIVE",
        "BONSAI_SPEC_NMAX",
        "BONSAI_KV4",
        "BONSAI_LLAMA_VERBOSE",
        "BONSAI_ALLOW_REMOTE",
        "BONSAI_PORT",
        "BONSAI_PROFILE",
        "BONSAI_HOME",
        "BONSAI_LLAMA_SERVER",
        "BONSAI_SPEC_TYPE",
    }
    assert reference <= set(BY_ENV)


def test_parse_value_keeps_typed_flag_values():
    assert parse_value(BY_ENV["BONSAI_PORT"], 8081, "--port") == 8081
    assert parse_value(BY_ENV["BONSAI_SPECULATIVE"], True, "--speculative") is True


def test_one_value_is_read_without_parsing_the_others():
    from bonsai_launch.config.settings import env_value, resolve

    env = {"BONSAI_API_KEY": "k1,k2", "BONSAI_PORT": "not-a-port"}
    with pytest.raises(BonsaiError):
        resolve({}, env)  # every setting: the bad port stops it
    assert env_value("api_key", env) == "k1,k2"  # `bonsai ps` needs only the key
    assert env_value("port", {"PORT": "9000"}) == 9000 and env_value("port", {}) == resolve({}, {})["port"]
