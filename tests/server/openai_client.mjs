// openai_client.mjs — drive a running pagedserve with the official OpenAI Node client and
// check what the client hands its users: completions (plain, streamed with usage, n = 2,
// logprobs, logit_bias, echo, stop with stop_reason, vLLM's stop_token_ids / min_tokens /
// include_stop_str_in_output), chat completions (plain, streamed with n = 2 and
// logprobs, vLLM's continue_final_message, errors), errors mapped to the client's error
// classes, the model list, and API keys. Run by tests/server/test_conformance.c, which
// starts the servers:
//
//   node openai_client.mjs --openai-dir DIR --port N --model ID [--auth-port N --api-key KEY]
//
// DIR holds node_modules/openai (the pinned version of tests/server/package.json). The
// script prints one line per check and ends with "openai_client: N passed, M failed"; it
// exits 1 when any check failed, 2 on bad arguments or when the client cannot be loaded.
//
// KNOWN lists checks that fail because of a server bug already reported to the lead: their
// failures are printed as KNOWN ISSUE and do not fail the run. Remove an entry once fixed.
import path from "node:path";
import { pathToFileURL } from "node:url";
import { parseArgs } from "node:util";

const KNOWN = new Set([]);

const { values: opt } = parseArgs({
  options: {
    "openai-dir": { type: "string" },
    port: { type: "string" },
    model: { type: "string" },
    "auth-port": { type: "string" },
    "api-key": { type: "string" },
  },
});
if (!opt["openai-dir"] || !opt.port || !opt.model) {
  console.error("usage: node openai_client.mjs --openai-dir DIR --port N --model ID " +
                "[--auth-port N --api-key KEY]");
  process.exit(2);
}

// The same module `import OpenAI from "openai"` loads, from the build tree's install.
let sdk;
try {
  sdk = await import(pathToFileURL(path.join(opt["openai-dir"], "node_modules", "openai",
                                             "index.mjs")).href);
} catch (e) {
  console.error(`cannot load the openai package from ${opt["openai-dir"]}: ${e.message}`);
  process.exit(2);
}
const { OpenAI, NotFoundError, BadRequestError, AuthenticationError } = sdk;

const MODEL = opt.model;
const ROOT = `http://127.0.0.1:${opt.port}`;

// maxRetries 0: the client would otherwise retry some failures and hide what the server said.
function makeClient(port, apiKey) {
  return new OpenAI({ baseURL: `http://127.0.0.1:${port}/v1`, apiKey, maxRetries: 0,
                      timeout: 20000, organization: null, project: null });
}
const client = makeClient(opt.port, "not-needed");

// ---- checks ------------------------------------------------------------------------------

let passed = 0, failed = 0, known = 0;

class CheckFailed extends Error {}

function show(v) {
  const s = JSON.stringify(v);
  return s === undefined ? String(v) : s.length > 300 ? s.slice(0, 300) + "..." : s;
}

// A failed check throws, so the rest of its case does not run on broken data; the next
// case still runs.
function check(cond, what, detail) {
  if (cond)
    return;
  throw new CheckFailed(`${what}${detail === undefined ? "" : `: ${show(detail)}`}`);
}

function checkEqual(got, want, what) {
  if (JSON.stringify(got) !== JSON.stringify(want))
    throw new CheckFailed(`${what}: got ${show(got)}, want ${show(want)}`);
}

// A check whose failure may be a known server bug (see KNOWN): it never stops its case.
function soft(cond, what, detail) {
  if (cond)
    return;
  if (KNOWN.has(what)) {
    known++;
    console.log(`KNOWN ISSUE ${what}: ${show(detail)}`);
    return;
  }
  throw new CheckFailed(`${what}: ${show(detail)}`);
}

async function runCase(name, fn) {
  try {
    await fn();
    passed++;
    console.log(`ok   ${name}`);
  } catch (e) {
    failed++;
    if (e instanceof CheckFailed)
      console.log(`FAIL ${name}: ${e.message}`);
    else
      console.log(`FAIL ${name}: unexpected ${e?.constructor?.name}: ${e?.message}\n${e?.stack}`);
  }
}

// The error a call throws (the check fails when it does not throw).
async function thrown(what, fn) {
  try {
    const r = await fn();
    if (r && typeof r[Symbol.asyncIterator] === "function")
      for await (const _ of r) { /* drain: an error frame throws here */ }
  } catch (e) {
    return e;
  }
  throw new CheckFailed(`${what}: no error thrown`);
}

const isCount = (v) => Number.isInteger(v) && v >= 0;
const FINISH = ["stop", "length"];

// /tokenize is not part of the OpenAI API: plain fetch, for the expected prompt_tokens.
async function promptTokens(prompt) {
  const r = await fetch(`${ROOT}/tokenize`, { method: "POST", body: JSON.stringify({ prompt }) });
  check(r.status === 200, "/tokenize answers 200", r.status);
  return (await r.json()).count;
}

// The raw JSON body of a request, to compare with what the client made of it.
async function rawError(pathname, init) {
  const r = await fetch(`${ROOT}${pathname}`, init);
  return { status: r.status, body: await r.json() };
}

function checkUsage(u, maxTokensTotal, what) {
  check(u && typeof u === "object", `${what}: usage is an object`, u);
  check(isCount(u.prompt_tokens) && isCount(u.completion_tokens) && isCount(u.total_tokens),
        `${what}: usage fields are counts`, u);
  checkEqual(u.total_tokens, u.prompt_tokens + u.completion_tokens,
             `${what}: total_tokens = prompt_tokens + completion_tokens`);
  check(u.completion_tokens <= maxTokensTotal, `${what}: completion_tokens <= max_tokens * n`, u);
}

function checkCompletion(r, n, what) {
  check(typeof r.id === "string" && r.id.length > 0, `${what}: id is a non-empty string`, r.id);
  checkEqual(r.object, "text_completion", `${what}: object`);
  check(Number.isInteger(r.created) && Math.abs(r.created - Date.now() / 1000) < 3600,
        `${what}: created is the current Unix time in seconds`, r.created);
  checkEqual(r.model, MODEL, `${what}: model`);
  check(Array.isArray(r.choices), `${what}: choices is an array`, r.choices);
  checkEqual(r.choices.map((c) => c.index), [...Array(n).keys()], `${what}: choice indices`);
  for (const c of r.choices) {
    check(typeof c.text === "string", `${what}: choices[${c.index}].text is a string`, c.text);
    check(FINISH.includes(c.finish_reason), `${what}: choices[${c.index}].finish_reason`,
          c.finish_reason);
  }
}

// Read a stream to its end: text, finish_reason and logprobs per choice index, the usage
// chunk, and the chunks' shape (one id, object, model; usage only on a last, choice-less one).
async function collectStream(params, what) {
  const stream = await client.completions.create({ ...params, stream: true });
  const out = { ids: new Set(), text: [], finish: [], logprobs: [], usage: null, chunks: 0,
                textAfterFinish: false, usageNotLast: false };
  for await (const chunk of stream) {
    out.chunks++;
    check(out.usage === null, `${what}: the usage chunk is the last one`, chunk);
    out.ids.add(chunk.id);
    checkEqual(chunk.object, "text_completion", `${what}: chunk object`);
    checkEqual(chunk.model, MODEL, `${what}: chunk model`);
    check(Number.isInteger(chunk.created), `${what}: chunk created is an integer`, chunk.created);
    if (chunk.usage) {
      checkEqual(chunk.choices, [], `${what}: the usage chunk has no choices`);
      out.usage = chunk.usage;
      continue;
    }
    for (const c of chunk.choices) {
      const i = c.index;
      check(Number.isInteger(i) && i >= 0 && i < (params.n ?? 1), `${what}: chunk index`, c);
      check(typeof c.text === "string", `${what}: chunk text is a string`, c);
      if (out.finish[i] && c.text.length > 0)
        out.textAfterFinish = true;
      out.text[i] = (out.text[i] ?? "") + c.text;
      if (c.finish_reason != null) {
        check(out.finish[i] === undefined, `${what}: one finish_reason per choice`, c);
        out.finish[i] = c.finish_reason;
      }
      if (c.logprobs) {
        const lp = (out.logprobs[i] ??= { tokens: [], token_logprobs: [], top_logprobs: [],
                                          text_offset: [] });
        for (const k of Object.keys(lp))
          lp[k].push(...(c.logprobs[k] ?? []));
      }
    }
  }
  check(out.ids.size === 1, `${what}: every chunk has one id`, [...out.ids]);
  check(!out.textAfterFinish, `${what}: no text after a choice's finish_reason`);
  return out;
}

// ---- the cases ---------------------------------------------------------------------------

const PROMPT = "Once upon a time";
const GREEDY = { model: MODEL, prompt: PROMPT, max_tokens: 24, temperature: 0 };
let greedy = null; // the plain greedy completion, reused by later cases

await runCase("completions.create: plain", async () => {
  const { data: r, response } = await client.completions.create(GREEDY).withResponse();
  checkCompletion(r, 1, "plain");
  checkEqual(r.choices[0].logprobs, null, "plain: logprobs without asking");
  check(response.headers.get("content-type")?.startsWith("application/json"),
        "plain: Content-Type is JSON", response.headers.get("content-type"));
  check(typeof r._request_id === "string" && r._request_id.length > 0,
        "plain: the client finds X-Request-Id (_request_id)", r._request_id);
  checkUsage(r.usage, GREEDY.max_tokens, "plain");
  checkEqual(r.usage.prompt_tokens, await promptTokens(PROMPT), "plain: prompt_tokens = /tokenize");
  if (r.choices[0].finish_reason === "length")
    checkEqual(r.usage.completion_tokens, GREEDY.max_tokens,
               "plain: finish length means completion_tokens = max_tokens");
  else
    check(r.usage.completion_tokens < GREEDY.max_tokens,
          "plain: finish stop before max_tokens", r.usage);
  greedy = r;
});

await runCase("completions.create: stream with include_usage", async () => {
  check(greedy, "needs the plain case's result");
  const s = await collectStream({ ...GREEDY, stream_options: { include_usage: true } }, "stream");
  check(s.chunks >= 2, "stream: several chunks", s.chunks);
  checkEqual(s.text[0], greedy.choices[0].text, "stream: concatenated text = plain text");
  checkEqual(s.finish[0], greedy.choices[0].finish_reason, "stream: finish_reason = plain's");
  check(s.usage, "stream: a last chunk with usage");
  checkEqual([s.usage.prompt_tokens, s.usage.completion_tokens, s.usage.total_tokens],
             [greedy.usage.prompt_tokens, greedy.usage.completion_tokens,
              greedy.usage.total_tokens], "stream: usage = plain usage");
  const s2 = await collectStream(GREEDY, "stream without usage");
  checkEqual(s2.usage, null, "stream without include_usage: no usage chunk");
  checkEqual(s2.text[0], greedy.choices[0].text, "stream without usage: text = plain text");
});

await runCase("completions.create: n = 2", async () => {
  check(greedy, "needs the plain case's result");
  const g = await client.completions.create({ ...GREEDY, n: 2 });
  checkCompletion(g, 2, "n=2 greedy");
  for (const c of g.choices)
    checkEqual(c.text, greedy.choices[0].text, `n=2 greedy: choice ${c.index} = the greedy text`);
  checkEqual(g.usage.completion_tokens, 2 * greedy.usage.completion_tokens,
             "n=2 greedy: completion_tokens of both choices");
  checkEqual(g.usage.prompt_tokens, greedy.usage.prompt_tokens, "n=2 greedy: prompt counted once");
  const P = { model: MODEL, prompt: "The cat", max_tokens: 10, n: 2, temperature: 0.9, seed: 11 };
  const r = await client.completions.create(P);
  checkCompletion(r, 2, "n=2 sampled");
  checkUsage(r.usage, 2 * P.max_tokens, "n=2 sampled");
  if (r.choices.every((c) => c.finish_reason === "length"))
    checkEqual(r.usage.completion_tokens, 2 * P.max_tokens, "n=2 sampled: both ran to max_tokens");
  const s = await collectStream(P, "n=2 sampled stream");
  checkEqual(s.text, r.choices.map((c) => c.text), "n=2 sampled: stream texts = plain (same seed)");
  checkEqual(s.finish, r.choices.map((c) => c.finish_reason), "n=2 sampled: stream finish reasons");
});

function checkLogprobs(lp, count, k, what) {
  check(lp && typeof lp === "object", `${what}: logprobs is an object`, lp);
  for (const key of ["tokens", "token_logprobs", "top_logprobs", "text_offset"])
    check(Array.isArray(lp[key]) && lp[key].length === count,
          `${what}: logprobs.${key} has one entry per token (${count})`, lp[key]);
  for (let i = 0; i < count; i++) {
    const tok = lp.tokens[i], l = lp.token_logprobs[i], top = lp.top_logprobs[i];
    check(typeof tok === "string", `${what}: tokens[${i}] is a string`, tok);
    check(Number.isInteger(lp.text_offset[i]) && (i === 0 || lp.text_offset[i] >= lp.text_offset[i - 1]),
          `${what}: text_offset is non-decreasing`, lp.text_offset);
    if (l === null && top === null)
      continue; // echo's first prompt token has nothing before it to be predicted from
    check(typeof l === "number" && Number.isFinite(l) && l <= 0,
          `${what}: token_logprobs[${i}] is a log-probability`, l);
    const entries = Object.entries(top ?? {});
    check(entries.length >= 1 && entries.length <= k + 1,
          `${what}: top_logprobs[${i}] has 1..${k + 1} entries`, top);
    check(entries.every(([, v]) => typeof v === "number" && v <= 0),
          `${what}: top_logprobs[${i}] values are log-probabilities`, top);
  }
}

await runCase("completions.create: logprobs = 2", async () => {
  const P = { ...GREEDY, max_tokens: 8, logprobs: 2 };
  const r = await client.completions.create(P);
  checkCompletion(r, 1, "logprobs");
  const lp = r.choices[0].logprobs;
  checkLogprobs(lp, r.usage.completion_tokens, 2, "logprobs");
  // Greedy decoding picks the most likely token: it is in its top list, with the top value.
  for (let i = 0; i < lp.tokens.length; i++) {
    const top = lp.top_logprobs[i], best = Math.max(...Object.values(top));
    check(Object.hasOwn(top, lp.tokens[i]), `logprobs: token ${i} is in its top_logprobs`,
          { token: lp.tokens[i], top });
    check(Math.abs(top[lp.tokens[i]] - lp.token_logprobs[i]) < 1e-5 &&
          Math.abs(best - lp.token_logprobs[i]) < 1e-5,
          `logprobs: greedy token ${i} has the top log-probability`, { i, lp: lp.token_logprobs[i], top });
  }
  // Streamed, the chunks' logprobs put together are the same lists.
  const s = await collectStream(P, "logprobs stream");
  checkEqual(s.text[0], r.choices[0].text, "logprobs stream: text");
  checkEqual(s.logprobs[0]?.tokens, lp.tokens, "logprobs stream: tokens");
  checkEqual(s.logprobs[0]?.text_offset, lp.text_offset, "logprobs stream: text_offset");
  check(s.logprobs[0].token_logprobs.every((v, i) => Math.abs(v - lp.token_logprobs[i]) < 1e-5),
        "logprobs stream: token_logprobs", [s.logprobs[0].token_logprobs, lp.token_logprobs]);
});

// logit_bias as the client sends it ({"<id>": bias}): +100 makes one token every token, and
// the stream agrees.
await runCase("completions.create: logit_bias", async () => {
  const r0 = await fetch(`${ROOT}/tokenize`, { method: "POST",
                                               body: JSON.stringify({ prompt: "apple" }) });
  const ids = (await r0.json()).tokens;
  const id = ids[ids.length - 1];
  const P = { ...GREEDY, max_tokens: 4, logprobs: 0, logit_bias: { [id]: 100 } };
  const r = await client.completions.create(P);
  checkCompletion(r, 1, "logit_bias");
  const toks = r.choices[0].logprobs.tokens;
  checkEqual(toks.length, 4, "logit_bias: four tokens");
  check(toks.every((t) => t === toks[0]), "logit_bias: the favoured token every time", toks);
  const s = await collectStream(P, "logit_bias stream");
  checkEqual(s.text[0], r.choices[0].text, "logit_bias stream: text");
});

// text_offset[i] is where token i starts in text: a token that is plain text (no bytes:
// fallback, no special token) is found there — give or take the leading space a
// SentencePiece decoder drops from the very first piece.
function offsetsPointAtTokens(text, lp) {
  const bad = [];
  for (let i = 0; i < lp.tokens.length; i++) {
    const tok = lp.tokens[i], at = lp.text_offset[i];
    if (tok.startsWith("bytes:") || /^<.*>$/.test(tok) || tok.includes("\uFFFD"))
      continue;
    if (text.startsWith(tok, at) || (at === 0 && text.startsWith(tok.replace(/^ /, ""), 0)))
      continue;
    bad.push({ i, token: tok, text_offset: at, text_there: text.slice(at, at + tok.length) });
  }
  return bad;
}

await runCase("completions.create: echo", async () => {
  const P = { model: MODEL, prompt: PROMPT, max_tokens: 6, temperature: 0 };
  const plain = await client.completions.create(P);
  const r = await client.completions.create({ ...P, echo: true });
  checkCompletion(r, 1, "echo");
  checkEqual(r.choices[0].text, PROMPT + plain.choices[0].text, "echo: text = prompt + completion");
  checkEqual(r.usage, plain.usage, "echo: usage as without echo");
  const s = await collectStream({ ...P, echo: true }, "echo stream");
  checkEqual(s.text[0], r.choices[0].text, "echo stream: text");

  // echo + logprobs: one entry per prompt token, then per generated token; the first
  // prompt token has no log-probability.
  const e = await client.completions.create({ ...P, echo: true, logprobs: 1 });
  const lp = e.choices[0].logprobs;
  const n = e.usage.prompt_tokens + e.usage.completion_tokens;
  checkLogprobs(lp, n, 1, "echo logprobs");
  checkEqual([lp.token_logprobs[0], lp.top_logprobs[0]], [null, null],
             "echo logprobs: the first prompt token has none");
  const plainLp = (await client.completions.create({ ...P, logprobs: 1 })).choices[0].logprobs;
  checkEqual(lp.tokens.slice(e.usage.prompt_tokens), plainLp.tokens,
             "echo logprobs: generated tokens as without echo");
  // Without echo, offsets count from the completion's start (vLLM) or the prompt's (the
  // legacy OpenAI service): either is accepted.
  const plainBad = [0, PROMPT.length].map((base) =>
    offsetsPointAtTokens(" ".repeat(base) + plain.choices[0].text, plainLp));
  check(plainBad.some((b) => b.length === 0), "text_offset points at each token in text (no echo)",
        plainBad[0]);

  // max_tokens 0 with echo: the prompt scored, nothing generated.
  const z = await client.completions.create({ ...P, max_tokens: 0, echo: true, logprobs: 1 });
  checkEqual(z.choices[0].text, PROMPT, "echo max_tokens 0: text = prompt");
  checkEqual(z.usage.completion_tokens, 0, "echo max_tokens 0: completion_tokens");
  checkLogprobs(z.choices[0].logprobs, z.usage.prompt_tokens, 1, "echo max_tokens 0");
  const bad = offsetsPointAtTokens(e.choices[0].text, lp);
  soft(bad.length === 0, "echo text_offset points at each token in text",
       { text: e.choices[0].text, mismatches: bad });
});

// Two characters of text that make a stop string: printable ASCII, not at the start.
function pickStop(text) {
  for (let i = Math.min(4, text.length - 2); i + 1 < text.length; i++)
    if (/^[!-~]{2}$/.test(text.slice(i, i + 2)))
      return text.slice(i, i + 2);
  for (let i = 1; i < text.length; i++)
    if (/^[!-~]$/.test(text[i]))
      return text[i];
  return null;
}

await runCase("completions.create: stop", async () => {
  check(greedy, "needs the plain case's result");
  const full = greedy.choices[0].text;
  const stop = pickStop(full);
  check(stop !== null, "stop: the greedy text has a printable character to stop at", full);
  const want = full.slice(0, full.indexOf(stop));
  for (const form of [stop, [stop, "\u00a7never\u00a7"]]) {
    const r = await client.completions.create({ ...GREEDY, stop: form });
    checkEqual(r.choices[0].text, want, `stop ${show(form)}: text ends before the stop string`);
    checkEqual(r.choices[0].finish_reason, "stop", `stop ${show(form)}: finish_reason`);
    checkEqual(r.choices[0].stop_reason, stop, `stop ${show(form)}: stop_reason (vLLM's)`);
    check(r.usage.completion_tokens <= greedy.usage.completion_tokens,
          `stop ${show(form)}: fewer tokens`, r.usage);
    const s = await collectStream({ ...GREEDY, stop: form }, `stop ${show(form)} stream`);
    checkEqual(s.text[0], want, `stop ${show(form)} stream: text`);
    checkEqual(s.finish[0], "stop", `stop ${show(form)} stream: finish_reason`);
  }
});

// vLLM's extensions, sent through the client as extra body fields: a token forced by
// logit_bias and listed in stop_token_ids ends the choice (stop_reason its id); min_tokens
// holds it off for that many tokens; include_stop_str_in_output keeps its text.
await runCase("completions.create: stop_token_ids, min_tokens, include_stop_str_in_output", async () => {
  const r0 = await fetch(`${ROOT}/tokenize`, { method: "POST",
                                               body: JSON.stringify({ prompt: "apple" }) });
  const ids = (await r0.json()).tokens;
  const id = ids[ids.length - 1];
  const P = { ...GREEDY, max_tokens: 8, logprobs: 0, logit_bias: { [id]: 100 },
              stop_token_ids: [id] };
  const r = await client.completions.create(P);
  checkEqual([r.choices[0].text, r.choices[0].finish_reason, r.choices[0].stop_reason],
             ["", "stop", id], "stop_token_ids: text, finish_reason, stop_reason");
  const m = await client.completions.create({ ...P, min_tokens: 3 });
  checkEqual(m.usage.completion_tokens, 4, "min_tokens 3: the stop token is the fourth");
  checkEqual(m.choices[0].stop_reason, id, "min_tokens 3: stop_reason");
  const kept = await client.completions.create({ ...P, include_stop_str_in_output: true });
  const forced = await client.completions.create({ ...P, stop_token_ids: [], max_tokens: 1 });
  checkEqual(kept.choices[0].text, forced.choices[0].text,
             "include_stop_str_in_output: the stop token's text is kept");
  const s = await collectStream({ ...P, min_tokens: 3 }, "stop_token_ids stream");
  checkEqual(s.finish[0], "stop", "stop_token_ids stream: finish_reason");
});

// ---- chat (the server runs with --chat-template chatml) --------------------------------------

const CHAT = { model: MODEL, max_tokens: 16, temperature: 0,
               messages: [{ role: "system", content: "Be brief." },
                          { role: "user", content: PROMPT }] };
const CHAT_PROMPT = `<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\n${PROMPT}` +
                    "<|im_end|>\n<|im_start|>assistant\n";
let chatPlain = null;

await runCase("chat.completions.create: plain = the completion of its rendered prompt", async () => {
  const { data: r, response } = await client.chat.completions.create(CHAT).withResponse();
  checkEqual(r.object, "chat.completion", "chat: object");
  check(typeof r.id === "string" && r.id.startsWith("chatcmpl-"), "chat: id", r.id);
  checkEqual(r.model, MODEL, "chat: model");
  check(typeof r._request_id === "string" && r._request_id.length > 0, "chat: _request_id",
        response.headers.get("x-request-id"));
  checkEqual(r.choices.length, 1, "chat: one choice");
  const c = r.choices[0];
  checkEqual([c.index, c.message.role], [0, "assistant"], "chat: index and role");
  check(typeof c.message.content === "string", "chat: content is a string", c.message);
  check(FINISH.includes(c.finish_reason), "chat: finish_reason", c.finish_reason);
  checkEqual(c.logprobs ?? null, null, "chat: no logprobs without asking");
  checkUsage(r.usage, CHAT.max_tokens, "chat");
  checkEqual(r.usage.prompt_tokens, await promptTokens(CHAT_PROMPT), "chat: prompt_tokens");
  const t = await client.completions.create({ model: MODEL, prompt: CHAT_PROMPT,
                                              max_tokens: CHAT.max_tokens, temperature: 0 });
  checkEqual(c.message.content, t.choices[0].text, "chat: content = the prompt's completion");
  chatPlain = r;
});

// vLLM's assistant prefill, sent through the client as extra fields: the reply continues
// the last message, and is the completion of the rendered prompt plus that message's text.
await runCase("chat.completions.create: continue_final_message (prefill)", async () => {
  const prefill = "Once upon";
  const r = await client.chat.completions.create({
    ...CHAT, messages: [...CHAT.messages, { role: "assistant", content: prefill }],
    continue_final_message: true, add_generation_prompt: false });
  const t = await client.completions.create({ model: MODEL, prompt: CHAT_PROMPT + prefill,
                                              max_tokens: CHAT.max_tokens, temperature: 0 });
  checkEqual(r.choices[0].message.content, t.choices[0].text,
             "prefill: content = the completion of the prompt and the prefill");
  checkEqual(r.usage.prompt_tokens, t.usage.prompt_tokens, "prefill: prompt_tokens");
});

await runCase("chat.completions.create: streamed, n = 2, logprobs", async () => {
  check(chatPlain, "needs the plain chat case's result");
  const stream = await client.chat.completions.create({
    ...CHAT, n: 2, logprobs: true, top_logprobs: 2, stream: true,
    stream_options: { include_usage: true } });
  const text = ["", ""], roles = [0, 0], finish = [], lps = [[], []], ids = new Set();
  let usage = null;
  for await (const chunk of stream) {
    ids.add(chunk.id);
    checkEqual(chunk.object, "chat.completion.chunk", "chat stream: object");
    check(usage === null, "chat stream: the usage chunk is the last one", chunk);
    if (chunk.usage) {
      checkEqual(chunk.choices, [], "chat stream: the usage chunk has no choices");
      usage = chunk.usage;
      continue;
    }
    for (const c of chunk.choices) {
      if (c.delta.role) roles[c.index]++;
      text[c.index] += c.delta.content ?? "";
      if (c.finish_reason) finish[c.index] = c.finish_reason;
      lps[c.index].push(...(c.logprobs?.content ?? []));
    }
  }
  check(ids.size === 1 && [...ids][0].startsWith("chatcmpl-"), "chat stream: one chatcmpl id", [...ids]);
  checkEqual(roles, [1, 1], "chat stream: one role delta per choice");
  const want = chatPlain.choices[0].message.content;
  checkEqual(text, [want, want], "chat stream: greedy choices = the plain content");
  checkEqual(finish, [chatPlain.choices[0].finish_reason, chatPlain.choices[0].finish_reason],
             "chat stream: finish_reason");
  checkEqual(usage?.completion_tokens, 2 * chatPlain.usage.completion_tokens, "chat stream: usage");
  for (const [i, list] of lps.entries()) {
    checkEqual(list.length, chatPlain.usage.completion_tokens, `chat logprobs ${i}: one per token`);
    for (const e of list) {
      check(typeof e.token === "string" && e.logprob <= 0 && Array.isArray(e.bytes),
            `chat logprobs ${i}: token, logprob, bytes`, e);
      check(e.top_logprobs.length === 2 &&
            Math.abs(Math.max(...e.top_logprobs.map((t) => t.logprob)) - e.logprob) < 1e-5,
            `chat logprobs ${i}: greedy token has the top log-probability`, e);
    }
  }
});

// response_format json_object: a reply that ended with "stop" is a JSON object.
await runCase("chat.completions.create: response_format json_object", async () => {
  const r = await client.chat.completions.create({
    ...CHAT, max_tokens: 64, response_format: { type: "json_object" } });
  const c = r.choices[0];
  check(FINISH.includes(c.finish_reason), "json_object: finish_reason", c.finish_reason);
  if (c.finish_reason === "stop") {
    let parsed = null;
    try { parsed = JSON.parse(c.message.content); } catch (e) { /* checked below */ }
    check(parsed !== null && typeof parsed === "object" && !Array.isArray(parsed),
          "json_object: the content parses as an object", c.message.content);
  } else {
    check(c.message.content.trimStart().startsWith("{"), "json_object: an object begins",
          c.message.content);
  }
});

// response_format json_schema, as the client sends it for structured outputs: a reply that
// ended with "stop" parses into the schema's shape; a schema the server cannot hold to is a
// BadRequestError naming response_format.
const MOOD_SCHEMA = {
  type: "object",
  properties: { ok: { type: "boolean" }, mood: { enum: ["happy", "sad"] },
                count: { type: ["integer", "null"] } },
  required: ["ok", "mood", "count"], additionalProperties: false };
await runCase("chat.completions.create: response_format json_schema", async () => {
  const r = await client.chat.completions.create({
    ...CHAT, max_tokens: 200, response_format: { type: "json_schema",
      json_schema: { name: "mood", strict: true, schema: MOOD_SCHEMA } } });
  const c = r.choices[0];
  check(FINISH.includes(c.finish_reason), "json_schema: finish_reason", c.finish_reason);
  if (c.finish_reason === "stop") {
    let v = null;
    try { v = JSON.parse(c.message.content); } catch (e) { /* checked below */ }
    check(v !== null && typeof v.ok === "boolean" && ["happy", "sad"].includes(v.mood) &&
          (v.count === null || Number.isInteger(v.count)) && Object.keys(v).length === 3,
          "json_schema: the content parses into the schema's shape", c.message.content);
  }
  const p = await client.chat.completions.create({ ...CHAT, max_tokens: 60,
    response_format: { type: "json_schema", json_schema: { name: "p", schema: {
      type: "object", properties: { s: { type: "string", pattern: "^[a-c]{1,3}-\\d$" } },
      required: ["s"] } } } });
  const ps = JSON.parse(p.choices[0].message.content);
  check(/^[a-c]{1,3}-\d$/.test(ps.s), "json_schema: the string holds its pattern", ps);
  const e = await thrown("json_schema multipleOf", () => client.chat.completions.create({
    ...CHAT, response_format: { type: "json_schema", json_schema: { name: "p", schema: {
      type: "object", properties: { s: { type: "number", multipleOf: 2 } } } } } }));
  check(e instanceof BadRequestError && e.param === "response_format" &&
        e.code === "invalid_json_schema", "json_schema: multipleOf is a 400",
        `${e?.constructor?.name} ${e?.param} ${e?.code}: ${e?.message}`);
});

// vLLM's structured outputs through the client's extra body fields (how vLLM's docs send
// them): the text or content is one of the choices, streamed or not; a regex holds the
// whole text (JavaScript's RegExp judges); a bad regex or a grammar is a BadRequestError
// naming the field.
const CHOICES = ["positive", "negative", " neutral"];
await runCase("structured_outputs choice and regex (completions, chat, stream)", async () => {
  const r = await client.completions.create({ ...GREEDY, n: 2, temperature: 1, seed: 7,
    structured_outputs: { choice: CHOICES } });
  for (const c of r.choices)
    check(CHOICES.includes(c.text) && c.finish_reason === "stop", "completions: a choice", c);
  const ch = await client.chat.completions.create({ ...CHAT, max_tokens: 16,
    guided_choice: CHOICES });
  check(CHOICES.includes(ch.choices[0].message.content), "chat: a choice", ch.choices[0]);
  const s = await collectStream({ ...GREEDY, structured_outputs: { choice: CHOICES } },
                                "choice stream");
  check(CHOICES.includes(s.text[0]), "stream: a choice", s.text[0]);
  const PATTERN = "[a-c]{2,4}-(x|yz)";
  const rr = await client.completions.create({ ...GREEDY, n: 2, temperature: 1, seed: 3,
    structured_outputs: { regex: PATTERN } });
  for (const c of rr.choices)
    check(new RegExp(`^(?:${PATTERN})$`).test(c.text) && c.finish_reason === "stop",
          "completions: the regex's whole text", c);
  const sr = await collectStream({ ...GREEDY, guided_regex: PATTERN }, "regex stream");
  check(new RegExp(`^(?:${PATTERN})$`).test(sr.text[0]), "stream: the regex's whole text", sr.text[0]);
  const e = await thrown("structured_outputs regex", () => client.completions.create({
    ...GREEDY, structured_outputs: { regex: "(a" } }));
  check(e instanceof BadRequestError && e.param === "structured_outputs.regex",
        "bad regex: a 400 naming structured_outputs.regex", `${e?.constructor?.name} ${e?.param}: ${e?.message}`);
  const g = await thrown("structured_outputs grammar", () => client.completions.create({
    ...GREEDY, structured_outputs: { grammar: "root ::= x" } }));
  check(g instanceof BadRequestError && g.param === "structured_outputs",
        "grammar: a 400 naming structured_outputs", `${g?.constructor?.name} ${g?.param}: ${g?.message}`);
});

await runCase("chat: a conversation kept from OpenAI (refusal: null, ...) = the plain one", async () => {
  check(chatPlain, "needs the plain chat case's result");
  const answer = chatPlain.choices[0].message.content;
  const history = (extra) => [...CHAT.messages, { role: "assistant", content: answer, ...extra },
                              { role: "user", content: "Again." }];
  const plain = await client.chat.completions.create({ ...CHAT, messages: history({}) });
  const kept = await client.chat.completions.create({
    ...CHAT, messages: history({ refusal: null, annotations: [], tool_calls: [] }),
    tools: [], tool_choice: "none", parallel_tool_calls: true, store: false,
    metadata: { session: "s1" }, service_tier: "auto" });
  checkEqual(kept.choices[0].message.content, plain.choices[0].message.content,
             "kept conversation: the same reply");
  checkEqual(kept.usage.prompt_tokens, plain.usage.prompt_tokens, "kept conversation: prompt_tokens");
});

// Tools as the client's own helpers use them: a required call read from the response, its
// result sent back in the conversation, a named call assembled by the stream helper, and
// runTools calling our function with the arguments it parsed. The grammar makes every call
// well formed even from this tiny model: a function offered, arguments of its schema.
const PICK = { type: "function", function: { name: "pick", description: "Pick a digit",
  parameters: { type: "object", properties: { n: { type: "integer", minimum: 0, maximum: 9 } },
                required: ["n"], additionalProperties: false } } };
const NAMED = { type: "function", function: { name: "pick" } };
// stories260K's 512-token context: the tools' description takes ~450 tokens of it, so no
// max_tokens (the rest of the context) and one short message.
const TOOL_CHAT = { model: MODEL, temperature: 0, messages: [{ role: "user", content: "Pick." }] };
const isPick = (args) => Number.isInteger(args?.n) && args.n >= 0 && args.n <= 9 &&
                         Object.keys(args).length === 1;
await runCase("chat tools: calls, a result sent back, the stream helper, runTools", async () => {
  const r = await client.chat.completions.create({
    ...TOOL_CHAT, tools: [PICK], tool_choice: "required", parallel_tool_calls: false });
  const c = r.choices[0], call = c.message.tool_calls?.[0];
  checkEqual([c.finish_reason, c.message.content, c.message.tool_calls?.length],
             ["tool_calls", null, 1], "tools: one call, no content");
  check(call?.type === "function" && call.function.name === "pick" && call.id.startsWith("call_"),
        "tools: a call of pick with an id", call);
  check(isPick(JSON.parse(call?.function?.arguments ?? "null")), "tools: its arguments fit the schema",
        call?.function?.arguments);
  const next = await client.chat.completions.create({
    ...TOOL_CHAT, max_tokens: 4, tools: [PICK], tool_choice: "none",
    messages: [...TOOL_CHAT.messages, c.message, { role: "tool", tool_call_id: call.id, content: "7" }] });
  check(typeof next.choices[0].message.content === "string", "tools: the result sent back is read",
        next.choices[0]);
  const stream = client.chat.completions.stream({ ...TOOL_CHAT, tools: [PICK],
                                                  tool_choice: NAMED });
  const done = await stream.finalChatCompletion();
  const sc = done.choices[0], scall = sc.message.tool_calls?.[0];
  checkEqual([sc.finish_reason, scall?.function?.name], ["stop", "pick"],
             "tools stream: the named call, finish_reason stop (as OpenAI)");
  check(isPick(JSON.parse(scall?.function?.arguments ?? "null")), "tools stream: its arguments",
        scall?.function?.arguments);
  let got = null;
  const runner = client.chat.completions.runTools({ ...TOOL_CHAT, tool_choice: NAMED,
    tools: [{ type: "function", function: { ...PICK.function, parse: JSON.parse,
                                           function: (args) => { got = args; return "ok"; } } }] });
  await runner.finalChatCompletion();
  check(isPick(got), "runTools: our function got the parsed arguments", got);
});

await runCase("chat errors: bad tools and orphan tool results are BadRequestError 400", async () => {
  const e = await thrown("chat tools", () => client.chat.completions.create({
    ...CHAT, tools: [{ type: "function", function: { name: "f", strict: true, parameters: {
      type: "object", properties: { s: { type: "number", multipleOf: 2 } } } } }] }));
  check(e instanceof BadRequestError && e.param === "tools", "chat tools: 400 naming tools",
        `${e?.constructor?.name} ${e?.param}: ${e?.message}`);
  const r = await thrown("chat tool role", () => client.chat.completions.create({
    ...CHAT, messages: [{ role: "tool", content: "x", tool_call_id: "1" }] }));
  check(r instanceof BadRequestError && r.param === "messages", "chat tool role: 400 naming messages",
        `${r?.constructor?.name} ${r?.param}: ${r?.message}`);
});

await runCase("errors: unknown model is NotFoundError 404", async () => {
  const body = { model: "no-such-model", prompt: "x", max_tokens: 1 };
  const raw = await rawError("/v1/completions", { method: "POST", body: JSON.stringify(body) });
  checkEqual(raw.status, 404, "raw status");
  for (const stream of [false, true]) {
    const what = `unknown model${stream ? " (stream)" : ""}`;
    const e = await thrown(what, () => client.completions.create({ ...body, stream }));
    check(e instanceof NotFoundError, `${what}: NotFoundError`, `${e?.constructor?.name}: ${e?.message}`);
    checkEqual(e.status, 404, `${what}: status`);
    checkEqual(e.message, `404 ${raw.body.error.message}`, `${what}: message`);
    checkEqual([e.type, e.code, e.param], ["invalid_request_error", "model_not_found", "model"],
               `${what}: type, code, param`);
    check(typeof e.requestID === "string" && e.requestID.length > 0, `${what}: requestID`, e.requestID);
  }
  const m = await thrown("models.retrieve unknown", () => client.models.retrieve("no-such-model"));
  check(m instanceof NotFoundError && m.status === 404, "models.retrieve unknown: NotFoundError 404",
        `${m?.constructor?.name} ${m?.status}: ${m?.message}`);
});

await runCase("errors: max_tokens -1 is BadRequestError 400", async () => {
  for (const stream of [false, true]) {
    const what = `max_tokens -1${stream ? " (stream)" : ""}`;
    const e = await thrown(what, () =>
      client.completions.create({ model: MODEL, prompt: "x", max_tokens: -1, stream }));
    check(e instanceof BadRequestError, `${what}: BadRequestError`, `${e?.constructor?.name}: ${e?.message}`);
    checkEqual(e.status, 400, `${what}: status`);
    checkEqual(e.param, "max_tokens", `${what}: param`);
    check(/^400 .+/.test(e.message), `${what}: message has the server's text`, e.message);
  }
});

await runCase("models.list and models.retrieve", async () => {
  const ids = [];
  for await (const m of client.models.list()) {
    checkEqual(m.object, "model", "models.list: object");
    check(Number.isInteger(m.created), "models.list: created is an integer", m.created);
    check(typeof m.owned_by === "string", "models.list: owned_by is a string", m.owned_by);
    ids.push(m.id);
  }
  checkEqual(ids, [MODEL], "models.list: the served model");
  const one = await client.models.retrieve(MODEL);
  checkEqual([one.id, one.object], [MODEL, "model"], "models.retrieve");
});

if (opt["auth-port"]) {
  await runCase("API key: right key works, wrong key is AuthenticationError 401", async () => {
    const good = makeClient(opt["auth-port"], opt["api-key"]);
    const ids = [];
    for await (const m of good.models.list())
      ids.push(m.id);
    checkEqual(ids, [MODEL], "right key: models.list");
    const r = await good.completions.create({ ...GREEDY, max_tokens: 4 });
    checkCompletion(r, 1, "right key: completion");
    let chunks = 0;
    for await (const _ of await good.completions.create({ ...GREEDY, max_tokens: 4, stream: true }))
      chunks++;
    check(chunks > 0, "right key: a stream", chunks);

    const bad = makeClient(opt["auth-port"], `${opt["api-key"]}-wrong`);
    const calls = {
      "models.list": () => bad.models.list(),
      "completions.create": () => bad.completions.create({ ...GREEDY, max_tokens: 4 }),
      "completions.create stream": () =>
        bad.completions.create({ ...GREEDY, max_tokens: 4, stream: true }),
    };
    for (const [what, fn] of Object.entries(calls)) {
      const e = await thrown(`wrong key: ${what}`, fn);
      check(e instanceof AuthenticationError, `wrong key: ${what}: AuthenticationError`,
            `${e?.constructor?.name}: ${e?.message}`);
      checkEqual(e.status, 401, `wrong key: ${what}: status`);
      check(/^401 .+/.test(e.message), `wrong key: ${what}: message has the server's text`, e.message);
    }
  });
}

console.log(`openai_client: ${passed} passed, ${failed} failed` +
            (known ? ` (${known} known issue${known > 1 ? "s" : ""} reported above)` : ""));
process.exit(failed === 0 ? 0 : 1);
