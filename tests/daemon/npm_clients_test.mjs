// Two more real npm clients against a running kvprd, through their own helpers: the Vercel AI SDK
// (`ai` with `@ai-sdk/openai-compatible`) and LangChain (`@langchain/openai`'s ChatOpenAI).
// Usage: node npm_clients_test.mjs PORT MODEL [tools|json] (NODE_PATH finds the packages).
// Without a mode: text and streaming with usage, on any model (tests/daemon/daemon_test.py: the demo).
// `tools`: a tool call, plain and streamed, on a model whose answer is one <tool_call>
// (daemon_test.py's qwen_tools). `json`: structured output (generateObject, withStructuredOutput)
// both as a forced tool call and as response_format json_schema (daemon_test.py's json_mode).
import { createRequire } from 'node:module';
const require = createRequire(import.meta.url);
const { createOpenAICompatible } = require('@ai-sdk/openai-compatible');
const { generateText, streamText, generateObject, tool } = require('ai');
const { ChatOpenAI } = require('@langchain/openai');
const { z } = require('zod');

const [port, model, mode] = process.argv.slice(2);
const baseURL = `http://127.0.0.1:${port}/v1`;
const apiKey = process.env.KVPR_TEST_API_KEY ?? 'unused';
let passed = 0, failed = 0;
function check(name, cond, detail) {
  if (cond) passed++;
  else { failed++; console.log(`FAIL: ${name}`, detail === undefined ? '' : JSON.stringify(detail)?.slice(0, 1500)); }
}

const kvpr = createOpenAICompatible({ name: 'kvpr', baseURL, apiKey });
// includeUsage: streamed answers ask for usage (stream_options.include_usage).
const chat = kvpr.chatModel(model, {}, { includeUsage: true });
const lc = (extra = {}) => new ChatOpenAI({ model, apiKey, configuration: { baseURL }, temperature: 0, maxRetries: 0,
  ...extra });

if (mode === 'tools') {
  const prompt = 'Weather in Paris?';
  const tools = { get_weather: tool({ description: 'Weather in a city', parameters: z.object({ city: z.string() }) }) };
  const r = await generateText({ model: chat, tools, prompt, temperature: 0, maxTokens: 40 });
  check('ai: generateText finds the tool call', r.finishReason === 'tool-calls' && r.toolCalls.length === 1 &&
    r.toolCalls[0].toolName === 'get_weather' && r.toolCalls[0].args.city === 'Paris', r.toolCalls);
  const s = streamText({ model: chat, tools, prompt, temperature: 0, maxTokens: 40 });
  const calls = [];
  for await (const part of s.fullStream) if (part.type === 'tool-call') calls.push(part);
  check('ai: streamText streams the same call', calls.length === 1 && calls[0].toolName === 'get_weather' &&
    calls[0].args.city === 'Paris' && (await s.usage).completionTokens > 0, calls);

  const weather = { type: 'function', function: { name: 'get_weather', description: 'Weather in a city',
    parameters: { type: 'object', properties: { city: { type: 'string' } }, required: ['city'] } } };
  const m = await lc({ maxTokens: 40 }).bindTools([weather]).invoke(prompt);
  check('langchain: bindTools().invoke() gives the tool call', m.tool_calls?.length === 1 &&
    m.tool_calls[0].name === 'get_weather' && m.tool_calls[0].args.city === 'Paris', m.tool_calls);
  let acc;
  for await (const chunk of await lc({ maxTokens: 40 }).bindTools([weather]).stream(prompt)) acc = acc ? acc.concat(chunk) : chunk;
  check('langchain: streamed chunks add up to the same call', acc?.tool_calls?.length === 1 &&
    acc.tool_calls[0].name === 'get_weather' && acc.tool_calls[0].args.city === 'Paris', acc?.tool_calls);
  console.log(`npm clients (tools): ${passed} passed, ${failed} failed`);
  process.exit(failed ? 1 : 0);
}

if (mode === 'json') {
  const prompt = 'Give me JSON';
  const schema = z.object({ b: z.boolean() });
  // The AI SDK's default for this provider: a forced tool whose parameters are the schema.
  const o = await generateObject({ model: chat, schema, prompt, temperature: 0, maxTokens: 80 });
  check('ai: generateObject (tool mode) gives the schema\'s object', typeof o.object.b === 'boolean' &&
    Object.keys(o.object).length === 1, o.object);
  const strict = kvpr.chatModel(model, {}, { supportsStructuredOutputs: true });
  const j = await generateObject({ model: strict, schema, prompt, temperature: 0, maxTokens: 80, mode: 'json' });
  check('ai: generateObject (json mode, response_format json_schema)', typeof j.object.b === 'boolean', j.object);
  const fc = await lc({ maxTokens: 80 }).withStructuredOutput(schema).invoke(prompt);
  check('langchain: withStructuredOutput (function calling)', typeof fc.b === 'boolean' && Object.keys(fc).length === 1, fc);
  const js = await lc({ maxTokens: 80 }).withStructuredOutput(schema, { method: 'jsonSchema' }).invoke(prompt);
  check('langchain: withStructuredOutput (json schema)', typeof js.b === 'boolean', js);
  console.log(`npm clients (json): ${passed} passed, ${failed} failed`);
  process.exit(failed ? 1 : 0);
}

// Text and streaming with usage.
const prompt = 'Tell me about caches.';
const t = await generateText({ model: chat, prompt, temperature: 0, maxTokens: 6 });
check('ai: generateText', typeof t.text === 'string' && t.finishReason === 'length' && t.usage.completionTokens === 6 &&
  t.usage.promptTokens > 0, { text: t.text, finish: t.finishReason, usage: t.usage });
const s = streamText({ model: chat, prompt, temperature: 0, maxTokens: 6 });
let streamed = '';
for await (const piece of s.textStream) streamed += piece;
const su = await s.usage;
check('ai: streamText equals generateText, with usage', streamed === t.text && su.completionTokens === 6 &&
  su.promptTokens === t.usage.promptTokens, { streamed, text: t.text, usage: su });
const c = await generateText({ model: kvpr.completionModel(model), prompt: 'Hello, my name is', temperature: 0, maxTokens: 8 });
check('ai: a completion model', c.text.length > 0 && c.usage.completionTokens === 8, { text: c.text, usage: c.usage });
try {
  await generateText({ model: kvpr.chatModel('no-such-model'), prompt, maxTokens: 2, maxRetries: 0 });
  check('ai: an unknown model is refused', false);
} catch (e) {
  check('ai: an unknown model is an APICallError with the server\'s message', e.statusCode === 404 &&
    /does not exist/.test(e.responseBody ?? e.message), { status: e.statusCode, message: e.message });
}

const m = await lc({ maxTokens: 6 }).invoke(prompt);
check('langchain: invoke', typeof m.content === 'string' && m.content === t.text && m.usage_metadata?.output_tokens === 6,
  { content: m.content, usage: m.usage_metadata });
let acc;
for await (const chunk of await lc({ maxTokens: 6 }).stream(prompt)) acc = acc ? acc.concat(chunk) : chunk;
check('langchain: stream adds up to invoke, with usage', acc?.content === m.content &&
  acc.usage_metadata?.output_tokens === 6, { content: acc?.content, usage: acc?.usage_metadata });
console.log(`npm clients: ${passed} passed, ${failed} failed`);
process.exit(failed ? 1 : 0);
