"""lm-evaluation-harness (PyPI `lm_eval`) against parity.serve, every number checked against
parity.Model directly.

    PYTHON test/clients/test_lm_eval.py BUILD_DIR [MODEL_DIR]

PYTHON is a Python with lm_eval (its `api` extra: requests, aiohttp, tenacity), `tokenizers`
and transformers (the conformance tier's venv). Starts `PYTHON -m parity.serve` on MODEL_DIR
(default test/data/tokenizer-model: a synthetic Qwen3 with a trained byte-level BPE tokenizer
of 512 tokens), runs `PYTHON -m lm_eval --model local-completions` with the two tasks of
test/clients/tasks/ (parity_choice: loglikelihood, multiple choice; parity_generate:
generate_until, greedy) twice, with token-id requests and with text requests (lm_eval's
tokenized_requests True and False; tokenizer_backend=huggingface either way, for its context
lengths), of 3 prompts each, 3 in flight at once (so each is served among others), and computes
the same through parity.Model in this process:
- parity_choice: each (question, choice) pair tokenized as lm_eval tokenizes it (the whole
  string, split where the context's tokens end), scored with Model.score; the log-likelihood
  (the sum of the choice's token log-probs, float32 values added in order) and is_greedy of
  every pair equal lm_eval's logged ones exactly, and so do acc per document and its mean;
- parity_generate: each prompt's greedy completion from Model.generate (temperature 0, stop
  at the generation config's end-of-sequence ids, at most max_gen_toks), decoded without
  special tokens and cut before the first stop string, equals lm_eval's logged text, and so
  does exact_match.
Exit status: 0 passed, 1 failed, 77 skipped (lm_eval, tokenizers or transformers missing).
"""
import glob
import json
import os
import shutil
import subprocess
import sys
import tempfile
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, os.path.join(REPO, "test", "serve"))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(HERE, "tasks"))
from test_curl import Server, harness  # noqa: E402
from utils import read_docs  # noqa: E402  (the tasks' documents)

TASKS = os.path.join(HERE, "tasks")
MODEL = os.path.join(REPO, "test", "data", "tokenizer-model")
SERVED_NAME = "parity-tokenizer-model"
SEED = 1234               # lm_eval's default request seed (greedy: it changes nothing)
BATCH = 3                 # prompts per lm_eval request
CONCURRENT = 3            # lm_eval requests in flight at once
CHOICE_CONTEXT = "Question: {question}\nAnswer:"   # parity_choice.yaml's doc_to_text
CHOICE_DELIMITER = " "                              # its target_delimiter
UNTIL = ["\n", "er"]                                # parity_generate.yaml's until
MAX_GEN_TOKS = 12


class LmEvalRun:
    """One `lm_eval --model local-completions` run against a server; its per-task samples
    (docs in order) and aggregated results."""

    def __init__(self, server, model_dir, out, tokenized):
        self.args = [
            sys.executable, "-m", "lm_eval", "--model", "local-completions",
            "--model_args", ",".join([
                "base_url=%s/v1/completions" % server.base, "model=" + SERVED_NAME,
                "tokenizer_backend=huggingface", "tokenizer=" + model_dir,
                "tokenized_requests=%s" % tokenized, "num_concurrent=%d" % CONCURRENT,
                "max_retries=1",
                "timeout=120"]),
            "--batch_size", str(BATCH), "--tasks", "parity_choice,parity_generate",
            "--include_path", TASKS, "--output_path", out, "--log_samples"]
        env = dict(os.environ)
        # Nothing from the network: the tokenizer is a directory, the documents a file.
        env.update(HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1", TRANSFORMERS_OFFLINE="1",
                   HF_HOME=os.path.join(out, "hf-home"), NO_PROXY="127.0.0.1",
                   TOKENIZERS_PARALLELISM="false")
        p = subprocess.run(self.args, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                           stdin=subprocess.DEVNULL, timeout=600)
        self.output = p.stdout.decode("utf-8", "replace")
        self.returncode = p.returncode
        self.samples, self.results = {}, {}
        if p.returncode:
            return
        for task in ("parity_choice", "parity_generate"):
            files = glob.glob(os.path.join(out, "*", "samples_%s_*.jsonl" % task))
            if len(files) != 1:
                raise AssertionError("%d sample files for %s under %s" % (len(files), task, out))
            with open(files[0], encoding="utf-8") as f:
                rows = [json.loads(line) for line in f if line.strip()]
            self.samples[task] = sorted(rows, key=lambda r: r["doc_id"])
        files = glob.glob(os.path.join(out, "*", "results_*.json"))
        if len(files) != 1:
            raise AssertionError("%d results files under %s" % (len(files), out))
        with open(files[0], encoding="utf-8") as f:
            self.results = json.load(f)["results"]

    def table(self):
        """lm_eval's closing table (the lines that start with '|')."""
        return "\n".join(line for line in self.output.splitlines() if line.startswith("|"))


class Direct:
    """The same numbers through parity.Model and the tokenizer, without the server."""

    def __init__(self, model_dir):
        from tokenizers import Tokenizer
        import parity
        self.tok = Tokenizer.from_file(os.path.join(model_dir, "tokenizer.json"))
        self.model = parity.Model(model_dir)
        with open(os.path.join(model_dir, "generation_config.json"), encoding="utf-8") as f:
            eos = json.load(f).get("eos_token_id")
        self.eos_ids = [] if eos is None else [eos] if isinstance(eos, int) else list(eos)

    def close(self):
        self.model.close()

    def encode(self, text):
        return self.tok.encode(text, add_special_tokens=False).ids

    def pair(self, context, continuation):
        """(context ids, continuation ids) as lm_eval's TemplateLM._encode_pair makes them for
        a causal model: trailing spaces of the context move to the continuation, the whole
        string is encoded, and the continuation is what follows the context's own tokens."""
        spaces = len(context) - len(context.rstrip())
        if spaces:
            context, continuation = context[:-spaces], context[-spaces:] + continuation
        whole = self.encode(context + continuation)
        n = len(self.encode(context))
        return whole[:n], whole[n:]

    def loglikelihood(self, context, continuation):
        """(sum of the continuation's token log-probs, whether each is the most likely token)
        from Model.score of context + continuation, under the server's defaults (policy
        aligned, backend bf16, raw log-probs)."""
        ctx, cont = self.pair(context, continuation)
        scores = self.model.score(ctx + cont, top_n=1)
        # score's value t - 1 is log p(token t | tokens before it)
        lps = scores.logprobs[len(ctx) - 1:]
        tops = [row[0] for row in scores.top_logprobs[len(ctx) - 1:]]
        assert len(lps) == len(cont)
        return sum(lps), all(lp == top for lp, top in zip(lps, tops))

    def generate(self, prompt, until, max_tokens):
        """(The greedy completion's text, whether a stop string ended it): Model.generate with
        temperature 0, stopping at the end-of-sequence ids; special tokens left out of the
        text; cut before the first stop string."""
        c = self.model.generate(self.encode(prompt), max_tokens=max_tokens, temperature=0.0,
                                seed=SEED, stop=self.eos_ids)[0]
        text = self.tok.decode(c.tokens, skip_special_tokens=True)
        cuts = [text.find(s) for s in until if s and s in text]
        return (text[:min(cuts)], True) if cuts else (text, False)


class LmEvalChecks:
    """The checks of one lm_eval run; `tokenized` is lm_eval's tokenized_requests (prompts sent
    as token ids, or as text that the server tokenizes)."""
    tokenized = None
    run_ = None
    direct = None

    @classmethod
    def setUpClass(cls):
        server = Server("--served-model-name", SERVED_NAME, model=MODEL)
        out = tempfile.mkdtemp(prefix="parity-lm-eval-")
        try:
            cls.run_ = LmEvalRun(server, MODEL, out, cls.tokenized)
        finally:
            cls.server_rc = server.stop()
            cls.server_output = server.stderr()
            shutil.rmtree(out, ignore_errors=True)
        print("\n" + " ".join(cls.run_.args))
        print(cls.run_.table())
        cls.direct = Direct(MODEL)
        cls.docs = read_docs()

    @classmethod
    def tearDownClass(cls):
        if cls.direct is not None:
            cls.direct.close()

    def test_0_ran(self):
        self.assertEqual(self.run_.returncode, 0, "lm_eval failed; its output:\n%s\nthe "
                         "server's:\n%s" % (self.run_.output[-6000:], self.server_output))
        self.assertEqual(self.server_rc, 0, "SIGTERM should stop the server with exit 0")

    def test_choice_loglikelihoods(self):
        samples = self.run_.samples["parity_choice"]
        self.assertEqual([s["doc_id"] for s in samples], list(range(len(self.docs))))
        correct, greedy = 0, 0
        for doc, s in zip(self.docs, samples):
            context = CHOICE_CONTEXT.format(question=doc["question"])
            want = []
            for k, choice in enumerate(doc["choices"]):
                args = s["arguments"]["gen_args_%d" % k]
                # the requests lm_eval made are the ones computed here
                self.assertEqual((args["arg_0"], args["arg_1"]),
                                 (context, CHOICE_DELIMITER + choice))
                want.append(self.direct.loglikelihood(context, CHOICE_DELIMITER + choice))
            got = [(float(ll), {"True": True, "False": False}[greedy])
                   for ll, greedy in s["filtered_resps"]]
            self.assertEqual(got, want, "document %d: lm_eval's (log-likelihood, is_greedy) "
                             "per choice != parity.Model's" % doc["id"])
            greedy += sum(g for _, g in want)
            lls = [ll for ll, _ in want]
            acc = float(lls.index(max(lls)) == doc["answer"])
            self.assertEqual(s["acc"], acc, "document %d: acc" % doc["id"])
            correct += acc
        self.assertEqual(self.run_.results["parity_choice"]["acc,none"],
                         correct / len(self.docs), "acc over the documents")
        # the documents reach both sides of is_greedy and of acc (docs.jsonl's last choice
        # "are" is the model's greedy continuation)
        self.assertTrue(0 < greedy < 3 * len(self.docs), "%d greedy choices" % greedy)
        self.assertTrue(0 < correct < len(self.docs), "%d right answers" % correct)

    def test_generate_until(self):
        samples = self.run_.samples["parity_generate"]
        self.assertEqual([s["doc_id"] for s in samples], list(range(len(self.docs))))
        matches, stopped = 0, 0
        for doc, s in zip(self.docs, samples):
            self.assertEqual(s["arguments"]["gen_args_0"]["arg_0"], doc["prompt"])
            want, cut = self.direct.generate(doc["prompt"], UNTIL, MAX_GEN_TOKS)
            stopped += cut
            self.assertEqual(s["filtered_resps"], [want], "document %d: lm_eval's generated "
                             "text != parity.Model's" % doc["id"])
            match = float(want == doc["target"])
            self.assertEqual(s["exact_match"], match, "document %d: exact_match" % doc["id"])
            matches += match
        self.assertEqual(self.run_.results["parity_generate"]["exact_match,none"],
                         matches / len(self.docs), "exact_match over the documents")
        # some completions end at a stop string, some at max_gen_toks
        self.assertTrue(0 < stopped < len(self.docs), "%d stopped by a stop string" % stopped)



class TestTokenIdRequests(LmEvalChecks, unittest.TestCase):
    tokenized = True


class TestTextRequests(LmEvalChecks, unittest.TestCase):
    # lm_eval decodes its tokens to text (loglikelihood) or sends the context as it is
    # (generate_until); its context lengths are still its own tokenizer's
    tokenized = False


def main():
    global MODEL
    missing = []
    for module in ("lm_eval", "tokenizers", "transformers"):
        try:
            __import__(module)
        except ImportError:
            missing.append(module)
    if missing:
        print("SKIP: the lm-evaluation-harness test needs %s in this Python (%s); run it with "
              "the conformance tier's venv" % (", ".join(missing), sys.executable))
        sys.exit(harness.SKIP)
    harness.setup()
    if len(sys.argv) > 2:
        MODEL = os.path.abspath(sys.argv.pop(2))
    if not os.path.isfile(os.path.join(MODEL, "tokenizer.json")):
        sys.exit("error: no tokenizer.json in %s" % MODEL)
    harness.run("lm-eval")


if __name__ == "__main__":
    main()
