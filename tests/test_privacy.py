"""Which knowledge bases may reach which model: the one privacy decision."""

from __future__ import annotations

import socket
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
        ("http://localhost:1234/v1", "device"),  # this machine's /etc/hosts: 127.0.0.1
        ("http://LocalHost:1234/v1", "device"),
        ("http://[::1]:8000/v1", "device"),
        ("https://[::1]/v1", "device"),
        ("http://[::ffff:127.0.0.1]:8000/v1", "device"),
        ("http://2130706433/v1", "device"),  # a socket goes to 127.0.0.1: so does the verdict
        ("http://10.1.2.3:11434/v1", "cloud"),
        ("http://192.168.1.5/v1", "cloud"),
        ("http://0.0.0.0:11434/v1", "cloud"),
        ("http://[::]:8000/v1", "cloud"),
        # Names that do not resolve here (no DNS on this machine) and URLs that do not parse
        # are undecided (None), which the gate treats as cloud: never "device".
        ("https://example.com/v1", None),
        ("http://localhost.example.com/v1", None),
        ("http://127.0.0.1.nip.io/v1", None),
        ("http://127.0.0.1@example.com/v1", None),  # the host is example.com
        ("http://example.com#@127.0.0.1/v1", None),
        ("auto", None),
        ("", None),
        ("http://[::1", None),
        ("http://127.0.0.1:notaport/v1", None),
        ("ftp://127.0.0.1/v1", None),
        ("127.0.0.1:11434", None),
    ],
)
def test_endpoint_location(url: str, location: str | None) -> None:
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
    ("url", "why"),
    [("http://10.1.2.3/v1", "gpt is a cloud model"),
     ("https://example.com/v1", "where gpt runs is unknown (treated as cloud)"),  # no DNS here
     ("auto", "where gpt runs is unknown (treated as cloud)"),
     ("http://[::1", "where gpt runs is unknown (treated as cloud)"),
     ("", "where gpt runs is unknown (treated as cloud)")],
)
def test_cloud_endpoint_skips_device_knowledge_bases_with_a_reason(url: str, why: str) -> None:
    result = allowed_knowledge_bases(ep(url, name="gpt"), [DIARY, RECIPES, TAX])
    assert result.allowed == [RECIPES]
    assert [(s.kb, s.reason) for s in result.skipped] == [
        (DIARY, f"device only, {why}"),
        (TAX, f"device only, {why}"),
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


# --------------------------------------------------------------------------- decided by address
# The gate resolves the endpoint's host when a request is made and says "device" only when every
# address it resolves to is loopback; the client then connects to an address that was checked.
# Unit level: socket.getaddrinfo is replaced in this process, so these tests prove what the gate
# and the client do with a resolver's answer, not anything about a real DNS server.


class Resolver:
    """A stand-in for socket.getaddrinfo: scripted answers per host, every call recorded."""

    def __init__(self, real, answers: dict[str, list[list[str]]]) -> None:
        self.real = real
        self.answers = answers
        self.calls: list[str] = []

    def __call__(self, host, port, *args, **kwargs):
        name = host.decode() if isinstance(host, bytes) else host
        if name not in self.answers:
            return self.real(host, port, *args, **kwargs)
        self.calls.append(name)
        script = self.answers[name]
        addresses = script.pop(0) if len(script) > 1 else script[0]
        if not addresses:
            raise socket.gaierror(socket.EAI_NONAME, "Name or service not known")
        out = []
        for address in addresses:
            family = socket.AF_INET6 if ":" in address else socket.AF_INET
            sockaddr = (address, port or 0, 0, 0) if family == socket.AF_INET6 else (address, port or 0)
            out.append((family, socket.SOCK_STREAM, socket.IPPROTO_TCP, "", sockaddr))
        return out


@pytest.fixture
def resolver(monkeypatch):
    def install(answers: dict[str, list[list[str]]]) -> Resolver:
        fake = Resolver(socket.getaddrinfo, answers)
        monkeypatch.setattr(socket, "getaddrinfo", fake)
        return fake

    return install


def test_localhost_is_judged_by_what_it_resolves_to_not_by_its_name(resolver) -> None:
    resolver({"localhost": [["10.0.0.5"]]})
    assert endpoint_location(ep("http://localhost:11434/v1")) == "cloud"
    assert allowed_knowledge_bases(ep("http://localhost:11434/v1"), [DIARY]).allowed == []


@pytest.mark.parametrize(
    ("addresses", "location"),
    [
        (["127.0.0.1"], "device"),
        (["127.0.0.1", "::1"], "device"),
        (["::ffff:127.0.0.1"], "device"),
        (["127.0.0.1", "93.184.216.34"], "cloud"),  # one non-loopback address is enough
        (["::1", "fe80::1"], "cloud"),
        (["0.0.0.0"], "cloud"),
        ([], None),  # does not resolve: undecidable, and treated as cloud
    ],
)
def test_a_name_is_on_device_only_if_every_address_is_loopback(resolver, addresses, location) -> None:
    resolver({"llm.test": [addresses]})
    assert endpoint_location(ep("http://llm.test:8080/v1")) == location
    gate = allowed_knowledge_bases(ep("http://llm.test:8080/v1"), [DIARY, RECIPES])
    assert gate.allowed == ([DIARY, RECIPES] if location == "device" else [RECIPES])


def test_a_device_verdict_pins_the_connection_to_the_checked_address(resolver) -> None:
    # A rebinding name: loopback when the gate asks, somewhere else on every later lookup. The
    # request must reach the loopback server (the address that was checked) and keep its Host.
    with FakeLLM(reply="ok") as fake:
        names = resolver({"rebind.test": [["127.0.0.1"], ["10.255.255.1"]]})
        endpoint = Endpoint("rebind", f"http://rebind.test:{fake.port}/v1", "m")
        from localkb.answer.privacy import locate

        placement = locate(endpoint)
        assert placement.location == "device" and placement.addresses == ("127.0.0.1",)
        text = complete(endpoint, [{"role": "user", "content": "hello"}], placement=placement,
                        timeout=Timeouts(5, 30))
        assert text == "ok"
        assert fake.request_headers[0]["host"] == f"rebind.test:{fake.port}"
    assert names.calls == ["rebind.test"]  # resolved once, when the decision was made


def test_a_device_verdict_never_connects_anywhere_else(resolver) -> None:
    # The same rebinding name, but the request is made without the turn's placement: it is
    # decided again when the request is made, the name now resolves off the machine, and the
    # request is refused before anything is sent for a device verdict it no longer has.
    from localkb.answer.privacy import Placement, locate
    from localkb.errors import LLMUnavailable

    with FakeLLM(reply="ok") as fake:
        resolver({"rebind.test": [["127.0.0.1"]]})
        endpoint = Endpoint("rebind", f"http://rebind.test:{fake.port}/v1", "m")
        stale = locate(endpoint)
        forged = Placement(location="device", host=stale.host, port=stale.port,
                           addresses=("10.255.255.1",), reason="forged")
        with pytest.raises(LLMUnavailable):
            complete(endpoint, [{"role": "user", "content": "x"}], placement=forged,
                     timeout=Timeouts(1, 1))
        assert fake.requests == []


@pytest.mark.parametrize(
    "host",
    ["127.1", "0x7f000001", "2130706433", "[::ffff:127.0.0.1]", "127\uff0e0\uff0e0\uff0e1",
     "127\u30020\u30020\u30021", "LOCALHOST", "localhost."],
)
def test_odd_spellings_get_the_verdict_of_the_address_they_resolve_to(host) -> None:
    # The real resolver of this machine: the verdict must agree with where a socket would go.
    import httpx

    try:
        raw = httpx.URL(f"http://{host}:8080/v1").raw_host.decode("ascii")
        addresses = {i[4][0] for i in socket.getaddrinfo(raw, 8080, type=socket.SOCK_STREAM)}
    except (OSError, ValueError):
        addresses = set()
    if not addresses:
        expected = None
    else:
        import ipaddress

        def loop(a: str) -> bool:
            ip = ipaddress.ip_address(a.split("%", maxsplit=1)[0])
            return (ip.ipv4_mapped or ip).is_loopback if ip.version == 6 else ip.is_loopback

        expected = "device" if all(loop(a) for a in addresses) else "cloud"
    assert endpoint_location(ep(f"http://{host}:8080/v1")) == expected


@pytest.mark.parametrize(
    "url",
    ["http://xn--localhost-:11434/v1", "http://0177.0.0.1/v1", "http://[::1/v1", "http://\udcff/v1",
     "http://a b/v1", "http://%00/v1", None, 12, "http://" + "a" * 70 + ".test/v1"],
)
def test_the_gate_is_total_anything_it_cannot_parse_is_unknown_and_treated_as_cloud(url) -> None:
    endpoint = Endpoint(name="odd", base_url=url, model="m")  # type: ignore[arg-type]
    assert endpoint_location(endpoint) is None
    gate = allowed_knowledge_bases(endpoint, [DIARY, RECIPES])
    assert gate.allowed == [RECIPES]
    assert gate.skipped[0].reason == "device only, where odd runs is unknown (treated as cloud)"
