"""Which knowledge bases may reach which model: the one privacy decision."""

from __future__ import annotations

from dataclasses import dataclass

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fakellm import FakeLLM
from localkb.answer.llm import Endpoint, Timeouts, complete
from localkb.answer.privacy import allowed_knowledge_bases, endpoint_location
from localkb.errors import PrivacyBlocked


@dataclass(frozen=True)
class KB:
    id: int
    name: str
    privacy: str


DIARY = KB(1, "diary", "device")
RECIPES = KB(2, "recipes", "cloud")
TAX = KB(3, "tax", "device")
ODD = KB(4, "odd", "public")  # an unknown privacy value


def ep(url: str, *, mark_cloud: bool = False, name: str = "model") -> Endpoint:
    return Endpoint(name=name, base_url=url, model="m", mark_cloud=mark_cloud)


@pytest.mark.parametrize(
    ("url", "location"),
    [
        ("http://127.0.0.1:11434/v1", "device"),
        ("http://127.8.9.10:8080/v1", "device"),
        ("http://localhost:1234/v1", "device"),
        ("http://LocalHost:1234/v1", "device"),
        ("http://[::1]:8000/v1", "device"),
        ("https://[::1]/v1", "device"),
        ("http://[::ffff:127.0.0.1]:8000/v1", "device"),
        ("http://10.1.2.3:11434/v1", "cloud"),
        ("http://192.168.1.5/v1", "cloud"),
        ("https://example.com/v1", "cloud"),
        ("https://api.openai.com/v1", "cloud"),
        ("http://0.0.0.0:11434/v1", "cloud"),
        ("http://[::]:8000/v1", "cloud"),
        ("auto", "cloud"),
        ("", "cloud"),
        ("http://[::1", "cloud"),
        ("http://127.0.0.1:notaport/v1", "cloud"),
        ("ftp://127.0.0.1/v1", "cloud"),
        ("127.0.0.1:11434", "cloud"),
        ("http://localhost.example.com/v1", "cloud"),
        ("http://127.0.0.1.nip.io/v1", "cloud"),
        ("http://127.0.0.1@example.com/v1", "cloud"),
        ("http://example.com#@127.0.0.1/v1", "cloud"),
        ("http://2130706433/v1", "cloud"),
    ],
)
def test_endpoint_location(url: str, location: str) -> None:
    assert endpoint_location(ep(url)) == location


def test_no_endpoint_means_extractive_answers_on_device() -> None:
    assert endpoint_location(None) == "device"


@pytest.mark.parametrize(
    "url", ["http://127.0.0.1:4000/v1", "http://localhost:4000", "http://[::1]"]
)
def test_loopback_endpoint_marked_cloud_is_cloud(url: str) -> None:
    assert endpoint_location(ep(url, mark_cloud=True)) == "cloud"


# No deadline: a test never fails on wall-clock time (a busy CI machine is slow, not wrong).
@settings(deadline=None)
@given(st.ip_addresses(v=4))
def test_ipv4_literal_is_device_exactly_when_in_127_slash_8(address) -> None:
    expected = "device" if str(address).startswith("127.") else "cloud"
    assert endpoint_location(ep(f"http://{address}:8080/v1")) == expected


def test_loopback_endpoint_gets_every_knowledge_base() -> None:
    result = allowed_knowledge_bases(ep("http://127.0.0.1:11434/v1"), [DIARY, RECIPES, TAX])
    assert result.allowed == [DIARY, RECIPES, TAX]
    assert result.skipped == []


def test_no_endpoint_gets_every_knowledge_base() -> None:
    result = allowed_knowledge_bases(None, [DIARY, RECIPES], strict=True)
    assert result.allowed == [DIARY, RECIPES]


@pytest.mark.parametrize(
    "url", ["http://10.1.2.3/v1", "https://example.com/v1", "auto", "http://[::1", ""]
)
def test_cloud_endpoint_skips_device_knowledge_bases_with_a_reason(url: str) -> None:
    result = allowed_knowledge_bases(ep(url, name="gpt"), [DIARY, RECIPES, TAX])
    assert result.allowed == [RECIPES]
    assert [(s.kb, s.reason) for s in result.skipped] == [
        (DIARY, "device only, gpt is a cloud model"),
        (TAX, "device only, gpt is a cloud model"),
    ]


def test_loopback_marked_cloud_skips_device_knowledge_bases() -> None:
    endpoint = ep("http://localhost:4000/v1", mark_cloud=True, name="litellm")
    result = allowed_knowledge_bases(endpoint, [DIARY, RECIPES])
    assert result.allowed == [RECIPES]
    assert result.skipped[0].reason == "device only, litellm is a cloud model"


def test_unknown_privacy_value_is_treated_as_device() -> None:
    result = allowed_knowledge_bases(ep("https://example.com/v1"), [ODD])
    assert result.allowed == []
    assert [s.kb for s in result.skipped] == [ODD]


def test_strict_mode_raises_privacy_blocked_naming_the_knowledge_bases() -> None:
    with pytest.raises(PrivacyBlocked) as info:
        allowed_knowledge_bases(
            ep("https://example.com/v1", name="gpt"), [DIARY, RECIPES, TAX], strict=True
        )
    err = info.value
    assert err.code == "privacy_blocked"
    assert "'diary'" in err.message and "'tax'" in err.message and "gpt" in err.message
    assert [kb["id"] for kb in err.detail["knowledge_bases"]] == [1, 3]


def test_strict_mode_passes_when_only_cloud_knowledge_bases_face_a_cloud_model() -> None:
    result = allowed_knowledge_bases(ep("https://example.com/v1"), [RECIPES], strict=True)
    assert result.allowed == [RECIPES]


def test_device_text_never_reaches_a_cloud_endpoint_over_the_wire() -> None:
    # The fake listens on loopback but the endpoint says it forwards to a cloud (as LiteLLM
    # does): what the gate lets through is all the "cloud" receives.
    passages = {DIARY: "my secret diary entry", RECIPES: "tomato soup recipe"}
    with FakeLLM(reply="ok") as fake:
        endpoint = Endpoint("litellm", fake.base_url, "m", mark_cloud=True)
        gate = allowed_knowledge_bases(endpoint, [DIARY, RECIPES])
        prompt = "\n".join(passages[kb] for kb in gate.allowed)
        complete(endpoint, [{"role": "user", "content": prompt}], timeout=Timeouts(5, 30))
        sent = str(fake.requests)
    assert "tomato soup recipe" in sent
    assert "my secret diary entry" not in sent
