// parity.serve driven by the official `openai` npm client (v4). Run by test_openai.py:
//     node openai_client.mjs BASE_URL MODEL
// (BASE_URL like http://127.0.0.1:PORT/v1), from a directory where `openai` resolves. Prints one
// line per check, "ok NAME" or "FAIL NAME: why", then "N passed, N failed"; exits 1 on a failure.
import OpenAI from "openai";

const [baseURL, model] = process.argv.slice(2);
if (!baseURL || !model) {
  console.error("usage: node openai_client.mjs BASE_URL MODEL");
  process.exit(2);
}

// Every request body the client sends, to see what it forwards.
const sent = [];
const recordingFetch = (url, init) => {
  sent.push({ url: String(url), body: init && init.body ? String(init.body) : null });
  return fetch(url, init);
};
const client = new OpenAI({ baseURL, apiKey: "parity-test", maxRetries: 0, timeout: 60000,
                            fetch: recordingFetch });

const PROMPT = "import os\nimport sys\n\n\ndef main(argv=None):\n";
const PROMPT_IDS = [...Buffer.from(PROMPT, "utf8")];

function assert(cond, msg) {
  if (!cond) throw new Error(msg);
}
function eq(a, b, msg) {
  const sa = JSON.stringify(a), sb = JSON.stringify(b);
  if (sa !== sb) throw new Error(`${msg}: ${sa.slice(0, 300)} != ${sb.slice(0, 300)}`);
}
// Equal as float32 bits: the server writes float32 values; each must read back as one.
function f32eq(a, b, msg) {
  assert(a.length === b.length, `${msg}: lengths ${a.length} != ${b.length}`);
  for (let k = 0; k < a.length; k++) {
    assert(Math.fround(a[k]) === a[k], `${msg}: ${a[k]} is not a float32 value`);
    assert(Object.is(Math.fround(a[k]), Math.fround(b[k])), `${msg}[${k}]: ${a[k]} != ${b[k]}`);
  }
}
const tokenName = (b) => (b < 128 ? String.fromCharCode(b) : "bytes:\\x" + b.toString(16).padStart(2, "0"));

let passed = 0, failed = 0;
async function check(name, fn) {
  try {
    await fn();
    passed++;
    console.log(`ok ${name}`);
  } catch (e) {
    failed++;
    console.log(`FAIL ${name}: ${e && e.stack ? e.stack : e}`);
  }
}

// A request expected to fail: the client throws OpenAI.APIError (or its subclass) with `status`.
async function expectError(params, status, extra = {}) {
  let err = null;
  try {
    await client.completions.create(params);
  } catch (e) {
    err = e;
  }
  assert(err !== null, `no error for ${JSON.stringify(params).slice(0, 200)}`);
  assert(err instanceof OpenAI.APIError, `not an OpenAI.APIError: ${err}`);
  assert(!(err instanceof OpenAI.APIConnectionError), `a connection error, not an answer: ${err}`);
  assert(err.status === status, `status ${err.status}, expected ${status}: ${err.message}`);
  assert(err.error && typeof err.error.message === "string" && err.error.message.length > 0,
         `no error.message in ${JSON.stringify(err.error)}`);
  assert(typeof err.type === "string", `no error.type: ${JSON.stringify(err.error)}`);
  for (const [k, v] of Object.entries(extra))
    assert(err[k] === v, `error.${k} is ${JSON.stringify(err[k])}, expected ${JSON.stringify(v)}`);
  return err;
}

const base = { model, prompt: PROMPT, max_tokens: 16, n: 2, seed: 1234, logprobs: 2 };
let ref = null;
let maxModelLen = 4096;

await check("models.list", async () => {
  const page = await client.models.list();
  const ids = page.data.map((m) => m.id);
  eq(ids, [model], "served ids");
  const m = page.data[0];
  assert(m.object === "model", `object ${m.object}`);
  assert(Number.isInteger(m.created), "created");
  assert(m.owned_by === "libparity", `owned_by ${m.owned_by}`);
  assert(Number.isInteger(m.max_model_len) && m.max_model_len > 1, "max_model_len");
  maxModelLen = m.max_model_len;
});

function checkShape(r, nChoices, maxTokens, logprobs) {
  assert(typeof r.id === "string" && r.id.startsWith("cmpl-"), `id ${r.id}`);
  assert(r.object === "text_completion", `object ${r.object}`);
  assert(Number.isInteger(r.created), "created");
  assert(r.model === model, `model ${r.model}`);
  assert(Number.isInteger(r.weight_version), "weight_version");
  assert(r.system_fingerprint === `parity-w${r.weight_version}`, `system_fingerprint ${r.system_fingerprint}`);
  assert(Number.isInteger(r.seed), "seed");
  eq(r.choices.map((c) => c.index), [...Array(nChoices).keys()], "choice indices");
  let total = 0;
  for (const c of r.choices) {
    assert(typeof c.text === "string", "text");
    assert(c.finish_reason === "stop" || c.finish_reason === "length", `finish_reason ${c.finish_reason}`);
    const lp = c.logprobs;
    assert(lp && Array.isArray(lp.tokens), "logprobs.tokens");
    const n = lp.tokens.length;
    assert(lp.token_logprobs.length === n, "token_logprobs length");
    assert(lp.text_offset.length === n, "text_offset length");
    assert(lp.top_logprobs.length === n, "top_logprobs length");
    for (let k = 0; k < n; k++) {
      const x = lp.token_logprobs[k];
      assert(typeof x === "number" && x <= 0 && Math.fround(x) === x, `token_logprobs[${k}] ${x}`);
      const top = lp.top_logprobs[k];
      const keys = Object.keys(top);
      assert(keys.length >= logprobs && keys.length <= logprobs + 1, `top_logprobs[${k}] has ${keys.length}`);
      assert(lp.tokens[k] in top, `drawn token ${JSON.stringify(lp.tokens[k])} not in top_logprobs[${k}]`);
      assert(top[lp.tokens[k]] === x, `top_logprobs[${k}] of the drawn token ${top[lp.tokens[k]]} != ${x}`);
    }
    eq(lp.text_offset, [...Array(n).keys()], "text_offset (one byte per token)");
    if (c.finish_reason === "length") assert(n === maxTokens, `${n} tokens with finish_reason length`);
    else assert(n <= maxTokens, `${n} tokens > max_tokens`);
    total += n;
  }
  const u = r.usage;
  assert(u.prompt_tokens === PROMPT_IDS.length, `usage.prompt_tokens ${u.prompt_tokens}`);
  assert(u.completion_tokens === total, `usage.completion_tokens ${u.completion_tokens} != ${total}`);
  assert(u.total_tokens === u.prompt_tokens + u.completion_tokens, "usage.total_tokens");
}

await check("completions.create shape (n=2, seed, logprobs=2)", async () => {
  ref = await client.completions.create({ ...base, return_token_ids: true });
  checkShape(ref, 2, 16, 2);
  assert(ref.seed === 1234, `seed ${ref.seed}`);
  for (const c of ref.choices) {
    eq(c.prompt_token_ids, PROMPT_IDS, "prompt_token_ids");
    eq(c.logprobs.tokens, c.token_ids.map(tokenName), "token strings from token_ids");
    eq(c.text, Buffer.from(c.token_ids).toString("utf8"), "text from token_ids");
  }
});

await check("same request twice: same tokens, same log-prob bits", async () => {
  const again = await client.completions.create({ ...base, return_token_ids: true });
  for (let i = 0; i < 2; i++) {
    eq(again.choices[i].token_ids, ref.choices[i].token_ids, `choice ${i} token_ids`);
    eq(again.choices[i].text, ref.choices[i].text, `choice ${i} text`);
    f32eq(again.choices[i].logprobs.token_logprobs, ref.choices[i].logprobs.token_logprobs,
          `choice ${i} token_logprobs`);
    eq(again.choices[i].logprobs.top_logprobs, ref.choices[i].logprobs.top_logprobs, `choice ${i} top_logprobs`);
  }
  const plain = await client.completions.create(base);
  assert(!("token_ids" in plain.choices[0]), "token_ids without return_token_ids");
  eq(plain.choices.map((c) => c.text), ref.choices.map((c) => c.text), "texts without return_token_ids");
});

await check("streaming equals non-streaming for the same seed", async () => {
  const stream = await client.completions.create({ ...base, stream: true,
                                                   stream_options: { include_usage: true } });
  const acc = [0, 1].map(() => ({ text: "", lp: [], tokens: [], finish: null, chunks: 0 }));
  let usage = null, count = 0, id = null;
  for await (const chunk of stream) {
    count++;
    assert(chunk.object === "text_completion", `chunk object ${chunk.object}`);
    assert(chunk.model === model, `chunk model ${chunk.model}`);
    id = id ?? chunk.id;
    assert(chunk.id === id && id.startsWith("cmpl-"), `chunk id ${chunk.id}`);
    if (chunk.choices.length === 0) {
      assert(chunk.usage, "a chunk without choices nor usage");
      usage = chunk.usage;
      continue;
    }
    assert(usage === null, "a choice chunk after the usage chunk");
    for (const c of chunk.choices) {
      const a = acc[c.index];
      assert(a, `chunk for choice ${c.index}`);
      assert(a.finish === null, `choice ${c.index}: a chunk after its finish_reason`);
      a.text += c.text;
      a.chunks++;
      if (c.logprobs) {
        a.lp.push(...c.logprobs.token_logprobs);
        a.tokens.push(...c.logprobs.tokens);
      }
      a.finish = c.finish_reason ?? null;
    }
  }
  // At least one chunk of text and the usage chunk; how many carry the text depends on how the
  // engine's steps fall against the handler's wake-ups (a chunk carries all drawn since the last).
  assert(count >= 2 && usage !== null, `${count} chunks, usage ${usage}`);
  for (let i = 0; i < 2; i++) {
    const r = ref.choices[i], a = acc[i];
    eq(a.text, r.text, `choice ${i} streamed text`);
    assert(a.finish === r.finish_reason, `choice ${i} last finish_reason ${a.finish} != ${r.finish_reason}`);
    eq(a.tokens, r.logprobs.tokens, `choice ${i} streamed tokens`);
    f32eq(a.lp, r.logprobs.token_logprobs, `choice ${i} streamed token_logprobs`);
  }
  assert(usage !== null, "no usage chunk with include_usage");
  eq(usage, ref.usage, "streamed usage");
});

await check("streaming without logprobs or usage", async () => {
  const stream = await client.completions.create({ model, prompt: PROMPT, max_tokens: 8, seed: 5,
                                                   stream: true });
  let text = "", finish = null, n = 0;
  for await (const chunk of stream) {
    assert(chunk.choices.length > 0, "a chunk without choices (no include_usage)");
    for (const c of chunk.choices) {
      assert(c.index === 0, `index ${c.index}`);
      text += c.text;
      finish = c.finish_reason ?? finish;
    }
    n++;
  }
  const r = await client.completions.create({ model, prompt: PROMPT, max_tokens: 8, seed: 5 });
  eq(text, r.choices[0].text, "streamed text");
  assert(finish === r.choices[0].finish_reason, `finish_reason ${finish}`);
  assert(r.choices[0].logprobs === null, "logprobs without being asked");
});

await check("token-id prompt equals the string prompt", async () => {
  const a = await client.completions.create({ model, prompt: PROMPT_IDS, max_tokens: 12, seed: 99,
                                              logprobs: 0, return_token_ids: true });
  const b = await client.completions.create({ model, prompt: PROMPT, max_tokens: 12, seed: 99,
                                              logprobs: 0, return_token_ids: true });
  eq(a.choices[0].token_ids, b.choices[0].token_ids, "token_ids");
  eq(a.choices[0].prompt_token_ids, PROMPT_IDS, "prompt_token_ids");
  f32eq(a.choices[0].logprobs.token_logprobs, b.choices[0].logprobs.token_logprobs, "token_logprobs");
  assert(a.choices[0].logprobs.top_logprobs === null, "top_logprobs with logprobs=0");
  assert(a.usage.prompt_tokens === PROMPT_IDS.length, "usage.prompt_tokens");
  const two = await client.completions.create({ model, prompt: [PROMPT_IDS, PROMPT_IDS.slice(0, 10)],
                                                max_tokens: 4, seed: 99, return_token_ids: true });
  eq(two.choices.map((c) => c.index), [0, 1], "indices for two prompts");
  eq(two.choices[1].prompt_token_ids, PROMPT_IDS.slice(0, 10), "second prompt");
  // Each prompt's completion is what that prompt alone gives with the same seed.
  for (const [i, p] of [[0, PROMPT_IDS], [1, PROMPT_IDS.slice(0, 10)]]) {
    const one = await client.completions.create({ model, prompt: p, max_tokens: 4, seed: 99,
                                                  return_token_ids: true });
    eq(two.choices[i].token_ids, one.choices[0].token_ids, `prompt ${i} of two`);
  }
});

await check("seed drawn by the server is returned and replays", async () => {
  const a = await client.completions.create({ model, prompt: PROMPT, max_tokens: 8, return_token_ids: true });
  assert(Number.isInteger(a.seed) || typeof a.seed === "number", `seed ${a.seed}`);
  // Seeds above 2^53 do not survive JSON.parse; replay only those that do.
  if (Number.isSafeInteger(a.seed)) {
    const b = await client.completions.create({ model, prompt: PROMPT, max_tokens: 8, seed: a.seed,
                                                return_token_ids: true });
    eq(b.choices[0].token_ids, a.choices[0].token_ids, "replayed token_ids");
  }
});

await check("negative temperature: 400", async () => {
  const e = await expectError({ ...base, temperature: -1 }, 400);
  assert(e instanceof OpenAI.BadRequestError, "not a BadRequestError");
  assert(e.type === "invalid_request_error", `type ${e.type}`);
});

await check("unknown model: 404 model_not_found", async () => {
  const e = await expectError({ ...base, model: "no-such-model" }, 404, { code: "model_not_found" });
  assert(e instanceof OpenAI.NotFoundError, "not a NotFoundError");
});

await check("unknown field (forwarded by the client): 400", async () => {
  const before = sent.length;
  await expectError({ ...base, bogus_field: 1 }, 400);
  const bodies = sent.slice(before).map((s) => JSON.parse(s.body));
  assert(bodies.length === 1 && bodies[0].bogus_field === 1, "the client did not send bogus_field");
});

await check("prompt longer than the model: 413 (param prompt)", async () => {
  await expectError({ model, prompt: "a".repeat(maxModelLen), max_tokens: 1 }, 413, { param: "prompt" });
});

await check("other range errors: 400", async () => {
  await expectError({ ...base, n: 9 }, 400);            // > --max-batch 8
  await expectError({ ...base, max_tokens: 0 }, 400);
  await expectError({ ...base, logprobs: 21 }, 400);
  await expectError({ ...base, prompt: [PROMPT_IDS.length, 300] }, 400);  // id out of range
  await expectError({ model, prompt: "a".repeat(maxModelLen - 4), max_tokens: 16 }, 400);
});

await check("server still answers after the errors", async () => {
  const r = await client.completions.create({ ...base, return_token_ids: true });
  eq(r.choices.map((c) => c.token_ids), ref.choices.map((c) => c.token_ids), "token_ids");
});

console.log(`openai-client: ${passed} passed, ${failed} failed`);
process.exit(failed ? 1 : 0);
