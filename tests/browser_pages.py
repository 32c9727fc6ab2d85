"""Pages and answers the real-browser tests share (Chromium: test_browser.py, Firefox:
test_firefox.py): the served pages, the question, and how the loopback model answers."""

from __future__ import annotations

import re

ERR_CODE = "ERR_7731"
FLUX_HTML = f"""<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>Flux capacitor error codes</title></head>
<body><main><article>
<h1>Flux capacitor error codes</h1>
<p>This page lists the error codes the time circuits report and what each of them means for
the driver. Read it before calling the workshop.</p>
<h2>{ERR_CODE}</h2>
<p>{ERR_CODE} means the flux capacitor overheated. Let it cool for ten minutes with the ignition
off, then check that the coolant line to the capacitor housing is not kinked.</p>
<h2>ERR_1200</h2>
<p>ERR_1200 means the time circuits lost their destination date. Enter the date again on the
keypad and confirm it twice.</p>
<p>Related: <a href="/manual.pdf">the workshop manual (PDF)</a>.</p>
</article></main></body></html>
"""
PDF_PAGES = [
    "Workshop manual, page one. General safety: disconnect the plutonium chamber before any "
    "repair work on the vehicle.",
    "Page two. The turbo encabulator code ZQ-5512 means the prefamulated amulite has worn out; "
    "replace the amulite and reset the panametric fan.",
]
SECRET = "The vault combination word is PINEAPPLE-4471 and must never leave this device."
SECRET_HTML = f"""<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>Private notes about the capacitor</title></head>
<body><main><article><h1>Private notes about the flux capacitor</h1>
<p>My own notes on the flux capacitor overheating: {ERR_CODE} happened twice last winter.
{SECRET}</p>
<p>The flux capacitor overheated because the garage was too warm; I moved the car.</p>
</article></main></body></html>
"""
QUESTION = f"What does {ERR_CODE} mean?"
GARAGE_HTML = """<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>Garage opening hours</title></head>
<body><main><article><h1>Garage opening hours</h1>
<p>The garage on Hill Valley Road opens at seven in the morning on weekdays and closes at six in
the evening. On Saturdays it opens at nine and closes at one; it stays closed on Sundays.</p>
<p>Bring the service booklet and the spare key when you drop the car off for an inspection.</p>
</article></main></body></html>
"""
TOOLBAR_HTML = """<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>Hoverboard charging guide</title></head>
<body><main><article><h1>Hoverboard charging guide</h1>
<p>Charge the hoverboard for three hours before its first ride, and never leave it charging
overnight near water. A blinking green light means the battery is balancing its cells.</p>
<p>Store it at half charge when it will not be ridden for a month or more.</p>
</article></main></body></html>
"""


def passage_number(prompt: str, needle: str) -> int | None:
    """The number of the fenced passage (chat.build_messages' BEGIN/END lines) containing ``needle``."""
    for m in re.finditer(r"<<<BEGIN PASSAGE (\d+) (\w+)>>>(.*?)<<<END PASSAGE \1 \2>>>", prompt, re.S):
        if needle in m.group(3):
            return int(m.group(1))
    return None


def added(n: int) -> str:
    """The save line's count, as render.reportText words it."""
    return f"{n} passage{'' if n == 1 else 's'} added"


def flux_reply(request: dict) -> str:
    """The loopback model's answer: ERR_7731 explained, citing the passage that explains it."""
    prompt = "\n".join(str(m.get("content", "")) for m in request.get("messages", []))
    n = passage_number(prompt, f"{ERR_CODE} means the flux capacitor overheated")
    if n is None:
        return "I don't know from these documents."
    return f"{ERR_CODE} means the flux capacitor overheated; let it cool for ten minutes [{n}]."
