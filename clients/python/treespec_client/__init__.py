"""A thin Python client of treespec's public API (proto/treespec/v1/generation.proto).

The stubs come from clients/python/generate_stubs.sh; put their folder on sys.path (or
PYTHONPATH) before importing this package. Needs grpcio and protobuf (Debian: python3-grpcio,
python3-protobuf).

    from treespec_client import Client
    client = Client("127.0.0.1:50051")
    for delta in client.stream("def fib(n):", max_new_tokens=64):
        print(delta.text, end="", flush=True)
    result = client.generate("def fib(n):", max_new_tokens=64, mode="off")
"""
import dataclasses
from typing import Iterator, Optional, Sequence

import grpc

from treespec.v1 import generation_pb2 as pb
from treespec.v1 import generation_pb2_grpc as pb_grpc

MODES = {
    "auto": pb.SPECULATION_MODE_AUTO,
    "off": pb.SPECULATION_MODE_OFF,
    "ngram": pb.SPECULATION_MODE_NGRAM,
    "draft_model": pb.SPECULATION_MODE_DRAFT_MODEL,
}


@dataclasses.dataclass
class Result:
    """A whole generation: what the stream carried, joined."""
    request_id: str
    token_ids: list
    text: str
    finish_reason: str            # "length", "eos", "stop_token", "stop_string", "context"
    prompt_tokens: int
    completion_tokens: int
    speculation: pb.SpeculationStats


def build_request(prompt: Optional[str] = None, *, token_ids: Optional[Sequence[int]] = None,
                  max_new_tokens: Optional[int] = None, temperature: float = 0.0,
                  top_p: Optional[float] = None, top_k: int = 0, seed: int = 0,
                  stop: Sequence[str] = (), stop_token_ids: Sequence[int] = (),
                  ignore_eos: bool = False, mode: str = "auto",
                  tree_budget: Optional[int] = None, max_depth: Optional[int] = None,
                  request_id: str = "", add_bos: bool = False) -> pb.GenerateRequest:
    """A GenerateRequest: a text `prompt` or `token_ids`; unset options take the server's
    defaults (GetModelInfo reports them)."""
    if (prompt is None) == (token_ids is None):
        raise ValueError("give exactly one of prompt and token_ids")
    request = pb.GenerateRequest(request_id=request_id.encode(), add_bos=add_bos,
                                 return_text=prompt is not None)
    if prompt is not None:
        request.text = prompt.encode()
    else:
        request.token_ids.ids.extend(token_ids)
    s = request.sampling
    if max_new_tokens is not None:
        s.max_new_tokens = max_new_tokens
    s.temperature = temperature
    if top_p is not None:
        s.top_p = top_p
    s.top_k, s.seed, s.ignore_eos = top_k, seed, ignore_eos
    s.stop_strings.extend(x.encode() for x in stop)
    s.stop_token_ids.extend(stop_token_ids)
    request.speculation.mode = MODES[mode]
    if tree_budget is not None:
        request.speculation.tree_budget = tree_budget
    if max_depth is not None:
        request.speculation.max_depth = max_depth
    return request


class Client:
    """One channel to a verifier (or a pool: any gRPC target, e.g. "dns:///verifier:50051").

    tls_ca: the CA that signed the verifier's certificate (PEM path): TLS; tls_cert + tls_key:
    a client certificate for mutual TLS; token: a bearer token (--auth_token_file on the
    verifier). Errors are grpc.RpcError; docs/clients.md says which codes to retry.
    """

    def __init__(self, target: str, *, tls_ca: Optional[str] = None,
                 tls_cert: Optional[str] = None, tls_key: Optional[str] = None,
                 token: Optional[str] = None):
        if tls_ca is None:
            if tls_cert or tls_key:
                raise ValueError("a client certificate needs TLS: give tls_ca too")
            self._channel = grpc.insecure_channel(target)
        else:
            def read(path):
                return open(path, "rb").read() if path else None
            credentials = grpc.ssl_channel_credentials(read(tls_ca), read(tls_key),
                                                       read(tls_cert))
            self._channel = grpc.secure_channel(target, credentials)
        self._stub = pb_grpc.GenerationStub(self._channel)
        self._metadata = (("authorization", f"Bearer {token}"),) if token else ()

    def close(self):
        self._channel.close()

    def info(self, timeout_s: float = 30) -> pb.ModelInfo:
        return self._stub.GetModelInfo(pb.GetModelInfoRequest(), timeout=timeout_s,
                                       metadata=self._metadata, wait_for_ready=True)

    def call(self, request: pb.GenerateRequest, timeout_s: Optional[float] = None):
        """The streaming call itself: iterate it for GenerateResponse deltas; .cancel() stops
        the request on the server (its KV pages are freed at the next step)."""
        return self._stub.Generate(request, timeout=timeout_s, metadata=self._metadata)

    def stream(self, prompt: Optional[str] = None, *, timeout_s: Optional[float] = None,
               **options) -> Iterator[pb.GenerateResponse]:
        """Deltas as they are accepted; the last carries finish_reason, usage, speculation."""
        yield from self.call(build_request(prompt, **options), timeout_s)

    def generate(self, prompt: Optional[str] = None, *, timeout_s: Optional[float] = None,
                 **options) -> Result:
        """The whole generation (build_request's options)."""
        ids, text, last = [], [], None
        for delta in self.stream(prompt, timeout_s=timeout_s, **options):
            ids.extend(delta.token_ids)
            text.append(delta.text)
            last = delta
        reason = pb.FinishReason.Name(last.finish_reason).removeprefix("FINISH_REASON_").lower()
        return Result(last.request_id, ids, "".join(text), reason, last.usage.prompt_tokens,
                      last.usage.completion_tokens, last.speculation)
