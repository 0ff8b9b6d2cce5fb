"""A call of several generations (OpenAI completions' prompts x n, a KServe call's texts) is admitted
all or none by the generation core's generate_many: its places taken at once, one limit (the model's
queue) at every door, a call that can never fit refused as a bad request rather than "retry"."""

from __future__ import annotations

import httpx2 as httpx

from tests.fixtures.server import metric, until

MODEL = "tiny-gpt"


def texts(n: int) -> dict:
    return {"inputs": [{"name": "text", "datatype": "BYTES", "shape": [n], "data": ["Once upon"] * n}]}


async def test_a_call_bigger_than_the_queue_is_400_at_every_door(start_server):
    srv = await start_server(gen_max_queue=2)
    admission = srv.server.registry.get("generation", MODEL).scheduler.admission
    async with httpx.AsyncClient(base_url=srv.http_url) as http:
        body = {"model": MODEL, "prompt": "Once", "n": 4, "max_tokens": 2}
        completion = await http.post("/v1/completions", json=body)
        kserve = await http.post(f"/v2/models/{MODEL}/infer", json=texts(3))
        assert completion.status_code == 400 and completion.json()["error"]["code"] == "INVALID_ARGUMENT"
        assert "needs 4 places" in completion.json()["error"]["message"]
        assert "split the call" in completion.json()["error"]["message"]
        assert kserve.status_code == 400 and "the limit is 2 (gen_max_queue)" in kserve.json()["error"]  # counted first
        assert admission.reserved == 0 and admission.waiting() == 0
        served = await http.post("/v1/completions", json={**body, "n": 2})
        assert served.status_code == 200 and len(served.json()["choices"]) == 2


async def test_a_refused_prompt_admits_none_of_the_call(start_server):
    """The second prompt is not a model's token ids: the first one is neither queued nor run."""
    srv = await start_server()
    admission = srv.server.registry.get("generation", MODEL).scheduler.admission
    before = metric("ts_tokens_total", {"model": MODEL, "direction": "input"})
    async with httpx.AsyncClient(base_url=srv.http_url) as http:
        reply = await http.post("/v1/completions", json={"model": MODEL, "prompt": [[0, 5, 6], [0, 10**9]]})
    assert reply.status_code == 400 and "prompt[1][1]" in reply.json()["error"]["message"]
    await until(lambda: admission.reserved == 0 and admission.waiting() == 0, what="no place held")
    assert metric("ts_tokens_total", {"model": MODEL, "direction": "input"}) == before  # nothing was queued


async def test_a_prompt_refused_after_tokenizing_takes_the_queued_ones_back(start_server):
    """prompt[1] passes the character bound but not the token limit (known once tokenized, after
    prompt[0] was queued): the call is 400, its places are given back and prompt[0] never decodes."""
    srv = await start_server()
    model = srv.server.registry.get("generation", MODEL)
    admission = model.scheduler.admission
    long = "7 " * model.max_prompt
    assert model.max_prompt_chars is None or len(long) <= model.max_prompt_chars
    decoded = metric("ts_tokens_total", {"model": MODEL, "direction": "output"})
    async with httpx.AsyncClient(base_url=srv.http_url) as http:
        body = {"model": MODEL, "prompt": ["Once upon a time", long], "max_tokens": 64}
        reply = await http.post("/v1/completions", json=body)
    message = reply.json()["error"]["message"]
    assert reply.status_code == 400 and message.startswith("prompt[1] is ") and " tokens; model " in message
    await until(lambda: admission.reserved == 0 and admission.waiting() == 0 and not model.scheduler.running)
    assert metric("ts_tokens_total", {"model": MODEL, "direction": "output"}) == decoded  # cancelled before its prefill
