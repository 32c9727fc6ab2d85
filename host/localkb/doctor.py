"""Checks that the store and the model are whole: counts agree across SQLite, usearch and keywords."""

from __future__ import annotations

from localkb.errors import LocalKBError
from localkb.store.kb import Store


def model_health(store: Store) -> dict:
    """Load the default model (sha256 checked) and embed one sentence."""
    model_id = store.settings.default_model
    out: dict = {"id": model_id}
    try:
        emb = store.models.get(model_id)
        emb.embed(["LocalKB model check."])
        out.update(emb.describe())
        out["ok"] = True
    except LocalKBError as err:
        out.update({"ok": False, "error": str(err), "code": err.code})
    return out


def doctor(store: Store, *, repair: bool = False) -> dict:
    """Model status plus a health report per knowledge base; ``repair`` rebuilds what disagrees."""
    kbs = []
    for rec in store.kbs():
        try:
            kbs.append(store.open_kb(rec.id).health(repair=repair))
        except LocalKBError as err:
            kbs.append({"kb": rec.id, "name": rec.name, "chunks": 0, "problems": [str(err)]})
    clean = all(not (k.get("problems_after_repair", k["problems"])) for k in kbs)
    model = model_health(store)
    return {"data_dir": str(store.root), "model": model, "knowledge_bases": kbs,
            "clean": clean and model["ok"]}
