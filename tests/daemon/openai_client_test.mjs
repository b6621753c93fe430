// The official `openai` npm client (v4) against a running kvprd: completions, chat and
// streaming for both. Usage: node openai_client_test.mjs PORT MODEL (NODE_PATH finds openai).
// With a third argument `tools`, tool calls instead, on a model whose answer is one
// <tool_call> (tests/daemon/daemon_test.py's qwen_tools; `tools no-content`: generic_tools, an
// answer of only the call): chat.completions.create with tools, the
// same streamed through the client's stream helper (which accumulates tool-call deltas), and
// the call's result sent back. With `json`, structured output through the parse helper
// (tests/daemon/daemon_test.py's json_mode); `responses-json` and `responses-tools`, the Responses
// API (responses_api and generic_tools there).
import { createRequire } from 'node:module';
const require = createRequire(import.meta.url);
const OpenAI = require('openai');

const [port, model] = process.argv.slice(2);
// KVPR_TEST_API_KEY: kvprd runs with --api-key (the client sends it as a Bearer token).
const client = new OpenAI({ baseURL: `http://127.0.0.1:${port}/v1`, apiKey: process.env.KVPR_TEST_API_KEY ?? 'unused',
  maxRetries: 0 });
let passed = 0, failed = 0;
function check(name, cond, detail) {
  if (cond) passed++;
  else { failed++; console.log(`FAIL: ${name}`, detail ?? ''); }
}

if (process.argv[4] === 'tools') {
  const tools = [{ type: 'function', function: { name: 'get_weather', description: 'Weather in a city',
    parameters: { type: 'object', properties: { city: { type: 'string' } }, required: ['city'] } } }];
  const messages = [{ role: 'user', content: 'Weather in Paris?' }];

  const r = await client.chat.completions.create({ model, messages, tools, temperature: 0, max_tokens: 40 });
  const msg = r.choices[0].message;
  check('create: a tool call', r.choices[0].finish_reason === 'tool_calls' && msg.tool_calls?.length === 1 &&
    msg.tool_calls[0].function.name === 'get_weather' &&
    JSON.parse(msg.tool_calls[0].function.arguments).city === 'Paris', r);

  // The stream helper accumulates tool-call deltas into the final message.
  const stream = client.beta.chat.completions.stream({ model, messages, tools, temperature: 0, max_tokens: 40 });
  const final = await stream.finalChatCompletion();
  const fm = final.choices[0].message;
  // (`no-content`: the generic format, whose answer is only the calls.)
  const content = process.argv[5] === 'no-content' ? !fm.content : fm.content === 'Checking.';
  check('stream helper: the same call', final.choices[0].finish_reason === 'tool_calls' && content &&
    fm.tool_calls?.length === 1 && fm.tool_calls[0].function.arguments === msg.tool_calls[0].function.arguments, final);

  const next = await client.chat.completions.create({ model, tools, max_tokens: 2, messages: [
    ...messages, msg, { role: 'tool', tool_call_id: msg.tool_calls[0].id, content: '21 C, sunny' }] });
  check('the result sent back', next.choices.length === 1 && next.usage.prompt_tokens > r.usage.prompt_tokens, next);
  console.log(`openai client (tools): ${passed} passed, ${failed} failed`);
  process.exit(failed ? 1 : 0);
}

if (process.argv[4] === 'responses-json') {
  // The Responses API (tests/daemon/daemon_test.py's responses_api, on the model whose JSON answer
  // is {"a":1}): create, the stream helper, parse with a zod text format, previous_response_id,
  // retrieve and delete.
  const { zodTextFormat } = require('openai/helpers/zod');
  const { z } = require('zod');
  const base = { model, input: 'Give me JSON', max_output_tokens: 12, temperature: 0 };
  const json = { format: { type: 'json_object' } };
  const r = await client.responses.create({ ...base, text: json });
  check('responses.create', r.object === 'response' && r.status === 'completed' && r.output_text === '{"a":1}' &&
    r.usage.output_tokens > 0, r);
  const stream = client.responses.stream({ ...base, text: json });
  let deltas = '';
  const types = [];
  for await (const event of stream) {
    types.push(event.type);
    if (event.type === 'response.output_text.delta') deltas += event.delta;
  }
  const final = await stream.finalResponse();
  // (The SDK adds the output_text convenience to what create returns, not to a stream's or retrieve's.)
  const text = (resp) => resp.output.filter((o) => o.type === 'message').map((o) => o.content[0].text).join('');
  check('responses.stream: the deltas are the final text', deltas === '{"a":1}' && text(final) === deltas &&
    types[0] === 'response.created' && types.at(-1) === 'response.completed', { deltas, types, final });
  const parsed = await client.responses.parse({ ...base,
    text: { format: zodTextFormat(z.object({ a: z.number().int() }), 'thing') } });
  check('responses.parse with a zod text format', parsed.output_parsed?.a === 1, parsed);
  const next = await client.responses.create({ ...base, text: json, previous_response_id: r.id, input: 'Again' });
  check('previous_response_id continues the conversation', next.previous_response_id === r.id &&
    next.usage.input_tokens > r.usage.input_tokens + r.usage.output_tokens, next);
  const got = await client.responses.retrieve(r.id);
  check('responses.retrieve', got.id === r.id && text(got) === '{"a":1}', got);
  await client.responses.del(r.id);
  let gone = false;
  try { await client.responses.retrieve(r.id); } catch (e) { gone = e.status === 404; }
  check('responses.del, then retrieve is a 404', gone);
  console.log(`openai client (responses): ${passed} passed, ${failed} failed`);
  process.exit(failed ? 1 : 0);
}

if (process.argv[4] === 'responses-tools') {
  // Function tools through the Responses API (daemon_test.py's generic_tools model, whose answer
  // is a call of get_weather): the call as an output item, streamed, and its output sent back.
  const tools = [{ type: 'function', name: 'get_weather', description: 'Weather in a city', strict: true,
    parameters: { type: 'object', properties: { city: { type: 'string' } }, required: ['city'],
      additionalProperties: false } }];
  const base = { model, input: 'Weather in Paris?', tools, max_output_tokens: 40, temperature: 0 };
  const r = await client.responses.create(base);
  const call = r.output.find((o) => o.type === 'function_call');
  check('responses.create: a function_call item', call?.name === 'get_weather' &&
    JSON.parse(call.arguments).city === 'Paris' && call.call_id, r);
  const stream = client.responses.stream(base);
  let args = '';
  for await (const event of stream) if (event.type === 'response.function_call_arguments.delta') args += event.delta;
  const final = await stream.finalResponse();
  const fcall = final.output.find((o) => o.type === 'function_call');
  check('responses.stream: the call, its arguments streamed', fcall?.arguments === call?.arguments &&
    args === call?.arguments, final);
  const next = await client.responses.create({ model, tools, max_output_tokens: 2, previous_response_id: r.id,
    input: [{ type: 'function_call_output', call_id: call.call_id, output: '21 C, sunny' }] });
  check('the call\'s output sent back', next.status !== 'failed' && next.usage.input_tokens > r.usage.input_tokens, next);
  console.log(`openai client (responses tools): ${passed} passed, ${failed} failed`);
  process.exit(failed ? 1 : 0);
}

if (process.argv[4] === 'json') {
  // Structured output through the client's parse helper, which reads the answer as the schema's
  // JSON (message.parsed) and a strict tool's forced call as its arguments (parsed_arguments).
  const messages = [{ role: 'user', content: 'Give me JSON' }];
  const schema = { type: 'object', properties: { b: { type: 'boolean' } }, required: ['b'], additionalProperties: false };
  const r = await client.beta.chat.completions.parse({ model, messages, temperature: 0, max_tokens: 80,
    response_format: { type: 'json_schema', json_schema: { name: 'flag', schema, strict: true } } });
  check('parse: json_schema answer as the parsed object', typeof r.choices[0].message.parsed?.b === 'boolean', r);
  const tools = [{ type: 'function', function: { name: 'get_weather', strict: true, parameters: { type: 'object',
    properties: { city: { type: 'string', maxLength: 8 } }, required: ['city'], additionalProperties: false } } }];
  const t = await client.beta.chat.completions.parse({ model, messages, tools, temperature: 0, max_tokens: 100,
    tool_choice: { type: 'function', function: { name: 'get_weather' } } });
  const call = t.choices[0].message.tool_calls?.[0];
  check('parse: a forced call with its parsed arguments', call?.function.name === 'get_weather' &&
    typeof call.function.parsed_arguments?.city === 'string', JSON.stringify(t.choices[0]));
  console.log(`openai client (json): ${passed} passed, ${failed} failed`);
  process.exit(failed ? 1 : 0);
}

const models = await client.models.list();
check('models.list', models.data.length === 1 && models.data[0].id === model, models.data);

const c = await client.completions.create({ model, prompt: 'Hello, my name is', max_tokens: 8, temperature: 0 });
check('completions.create', c.object === 'text_completion' && c.choices[0].text.length > 0 &&
  c.usage.completion_tokens === 8 && c.choices[0].finish_reason === 'length', c);

const cs = await client.completions.create({ model, prompt: 'Hello, my name is', max_tokens: 8, temperature: 0, stream: true });
let text = '', finish = null;
for await (const chunk of cs) {
  text += chunk.choices[0]?.text ?? '';
  if (chunk.choices[0]?.finish_reason) finish = chunk.choices[0].finish_reason;
}
check('completions stream equals non-streaming', text === c.choices[0].text && finish === 'length', { text, finish });

const messages = [{ role: 'system', content: 'Be brief.' }, { role: 'user', content: 'Tell me about caches.' }];
const chat = await client.chat.completions.create({ model, messages, max_tokens: 6, temperature: 0 });
check('chat.completions.create', chat.object === 'chat.completion' && chat.choices[0].message.role === 'assistant' &&
  typeof chat.choices[0].message.content === 'string', chat);

const stream = await client.chat.completions.create({ model, messages, max_tokens: 6, temperature: 0, stream: true,
  stream_options: { include_usage: true } });
let content = '', usage = null, role = null;
for await (const chunk of stream) {
  if (chunk.usage) usage = chunk.usage;
  const d = chunk.choices[0]?.delta;
  if (d?.role) role = d.role;
  content += d?.content ?? '';
}
check('chat stream equals non-streaming', content === chat.choices[0].message.content, { content, chat: chat.choices[0] });
check('chat stream role and usage', role === 'assistant' && usage && usage.completion_tokens === chat.usage.completion_tokens, { role, usage });

// Log-probabilities through the client: chat alternatives, and streamed chunks that carry them.
const lp = await client.chat.completions.create({ model, messages, max_tokens: 4, temperature: 0, logprobs: true,
  top_logprobs: 3 });
const lpc = lp.choices[0].logprobs?.content ?? [];
check('chat logprobs with top_logprobs', lpc.length === 4 && lpc.every((t) => t.top_logprobs.length === 3 &&
  t.top_logprobs[0].token === t.token && t.logprob <= 0 && Array.isArray(t.bytes)), lp.choices[0]);
const lps = await client.chat.completions.create({ model, messages, max_tokens: 4, temperature: 0, logprobs: true,
  top_logprobs: 3, stream: true });
const streamed = [];
for await (const chunk of lps) streamed.push(...(chunk.choices[0]?.logprobs?.content ?? []));
check('chat stream carries the same logprobs', JSON.stringify(streamed.map((t) => t.token)) ===
  JSON.stringify(lpc.map((t) => t.token)), { streamed, lpc });
const scored = await client.completions.create({ model, prompt: 'Hello, my name is', max_tokens: 0, echo: true,
  logprobs: 1 });
const sl = scored.choices[0].logprobs;
check('echo + logprobs scores the prompt', scored.choices[0].text === 'Hello, my name is' &&
  sl.token_logprobs[0] === null && sl.token_logprobs.slice(1).every((v) => v <= 0), scored.choices[0]);

try {
  await client.completions.create({ model: 'no-such-model', prompt: 'x', max_tokens: 2 });
  check('unknown model rejected', false);
} catch (e) {
  check('unknown model is a 404 APIError', e instanceof OpenAI.APIError && e.status === 404 && /does not exist/.test(e.message), e);
}
try {
  await client.completions.create({ model, prompt: 'x', max_tokens: 2, temperature: 5 });
  check('bad temperature rejected', false);
} catch (e) {
  check('bad temperature is a 400 with param', e.status === 400 && e.error?.param === 'temperature', e.error);
}
console.log(`openai client: ${passed} passed, ${failed} failed`);
process.exit(failed ? 1 : 0);
