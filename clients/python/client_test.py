"""The Python client against the real binaries: a drafter and a verifier with the tiny pair.

    clients/python/run_test.sh BIN_DIR     (ctest: python_client_test)

Greedy and seeded sampling give the same tokens with speculation on and off; speculation off
reports its steps (mean acceptance length 1.0); a cancelled stream frees its KV pages; bad input
gets INVALID_ARGUMENT naming the field.
"""
import argparse
import os
import re
import select
import subprocess
import sys
import time
import unittest

import grpc

ARGS = None  # set in main: bin_dir, root


def start(argv, log_path):
    """Starts a service binary; returns (process, "host:port") once it serves."""
    with open(log_path, "w") as log:
        proc = subprocess.Popen(argv + ["--port=0", "--metrics_port=-1"],
                                stdout=subprocess.PIPE, stderr=log, text=True)
    deadline = time.time() + 120
    while time.time() < deadline:
        ready, _, _ = select.select([proc.stdout], [], [], 1.0)
        if ready:
            line = proc.stdout.readline()
            m = re.search(r"listening on (\S+)", line)
            if m:
                return proc, m.group(1)
        if proc.poll() is not None:
            break
    proc.kill()
    raise RuntimeError(f"{argv[0]} did not start; see {log_path}")


class ClientTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        from treespec_client import Client  # the stubs' folder is on sys.path by now
        b, root, logs = ARGS.bin_dir, ARGS.root, ARGS.log_dir
        cls.drafter, drafter_addr = start(
            [f"{b}/treespec-drafter", f"--draft_model={root}/models/tiny-draft"],
            f"{logs}/drafter.log")
        cls.verifier, addr = start(
            [f"{b}/treespec-verifier", f"--model={root}/models/tiny-target",
             f"--drafter={drafter_addr}", "--draft_timeout_ms=2000"], f"{logs}/verifier.log")
        cls.client = Client(addr)

    @classmethod
    def tearDownClass(cls):
        cls.client.close()
        for proc in (cls.verifier, cls.drafter):
            proc.terminate()
            proc.wait(timeout=60)
            proc.stdout.close()

    PROMPT = "def fibonacci(n):\n    "

    def test_info(self):
        info = self.client.info()
        self.assertEqual(info.vocab_size, 4096)
        self.assertGreater(info.max_tree_budget, 0)

    def test_greedy_is_the_same_with_speculation_on_and_off(self):
        off = self.client.generate(self.PROMPT, max_new_tokens=32, ignore_eos=True, mode="off")
        on = self.client.generate(self.PROMPT, max_new_tokens=32, ignore_eos=True,
                                  mode="draft_model")
        self.assertEqual(len(off.token_ids), 32)
        self.assertEqual(on.token_ids, off.token_ids)
        self.assertEqual(on.text, off.text)
        self.assertEqual(off.finish_reason, "length")
        self.assertGreater(on.speculation.mean_acceptance_length, 1.0)
        # Speculation off counts its steps too: 31 after prefill, each without a draft.
        self.assertEqual(off.speculation.steps, 31)
        self.assertEqual(off.speculation.mean_acceptance_length, 1.0)

    def test_seeded_sampling_is_the_same_with_speculation_on_and_off(self):
        runs = [self.client.generate(self.PROMPT, max_new_tokens=24, ignore_eos=True,
                                     temperature=0.8, top_p=0.95, seed=1234, mode=mode)
                for mode in ("off", "draft_model", "ngram")]
        self.assertEqual(runs[1].token_ids, runs[0].token_ids)
        self.assertEqual(runs[2].token_ids, runs[0].token_ids)

    def test_cancel_frees_the_kv_cache(self):
        from treespec_client import build_request
        total = self.client.info().kv_cache_pages
        call = self.client.call(build_request(self.PROMPT, max_new_tokens=1500, ignore_eos=True))
        first = next(call)
        self.assertGreater(len(first.token_ids), 0)
        call.cancel()
        with self.assertRaises(grpc.RpcError) as raised:
            for _ in call:
                pass
        self.assertEqual(raised.exception.code(), grpc.StatusCode.CANCELLED)
        deadline = time.time() + 30
        while self.client.info().kv_pages_free != total and time.time() < deadline:
            time.sleep(0.05)
        self.assertEqual(self.client.info().kv_pages_free, total)

    def test_bad_input_is_invalid_argument_naming_the_field(self):
        from treespec_client import build_request
        with self.assertRaises(grpc.RpcError) as raised:
            self.client.generate(token_ids=[1, 2, 99999])
        self.assertEqual(raised.exception.code(), grpc.StatusCode.INVALID_ARGUMENT)
        self.assertIn("out of range [0, 4096)", raised.exception.details())
        request = build_request(self.PROMPT)
        request.request_id = b"id-\xc3\x28"  # not UTF-8
        with self.assertRaises(grpc.RpcError) as raised:
            list(self.client.call(request))
        self.assertEqual(raised.exception.code(), grpc.StatusCode.INVALID_ARGUMENT)
        self.assertIn("request_id is not valid UTF-8", raised.exception.details())


def main():
    global ARGS
    parser = argparse.ArgumentParser()
    parser.add_argument("--bin_dir", required=True)
    parser.add_argument("--stubs", required=True, help="generate_stubs.sh's output folder")
    parser.add_argument("--log_dir", default="/tmp")
    ARGS, rest = parser.parse_known_args()
    ARGS.root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    sys.path[:0] = [ARGS.stubs, os.path.dirname(os.path.abspath(__file__))]
    unittest.main(argv=[sys.argv[0]] + rest, verbosity=2)


if __name__ == "__main__":
    main()
