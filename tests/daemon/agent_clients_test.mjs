// Agent frameworks against a running kvprd, each through its own API: the OpenAI Agents SDK
// (@openai/agents, with its chat-completions model and its Responses model), instructor-js
// (@instructor-ai/instructor, TOOLS and JSON_SCHEMA modes) and LlamaIndex.TS (@llamaindex/openai's
// OpenAI and OpenAIResponses). Usage: node agent_clients_test.mjs PORT MODEL tools|json (NODE_PATH
// finds the packages).
// `tools`: on tests/daemon/daemon_test.py's generic_tools model (ChatML, tools in the generic
// format; its answer is a call of get_weather for Paris): an agent's function tool is called, and
// LlamaIndex gets the call. `json`: on responses_api's model (whose best JSON is {"a":1}): an
// agent's output type, and instructor's response_model.
import { createRequire } from 'node:module';
const require = createRequire(import.meta.url);
const { z } = require('zod');
const agents = require('@openai/agents');
const { OpenAIChatCompletionsModel, OpenAIResponsesModel } = require('@openai/agents-openai');
// The Agents SDK's own openai client (its major version, not the one the other tests pin).
const AgentsOpenAI = createRequire(require.resolve('@openai/agents-openai'))('openai');
const OpenAI = require('openai');
const Instructor = require('@instructor-ai/instructor').default;
const llamaindex = require('@llamaindex/openai');
const { tool: llamaTool } = require('@llamaindex/core/tools');

const [port, model, mode] = process.argv.slice(2);
const baseURL = `http://127.0.0.1:${port}/v1`;
const apiKey = process.env.KVPR_TEST_API_KEY ?? 'unused';
let passed = 0, failed = 0;
function check(name, cond, detail) {
  if (cond) passed++;
  else { failed++; console.log(`FAIL: ${name}`, detail === undefined ? '' : JSON.stringify(detail)?.slice(0, 1500)); }
}
async function attempt(name, f) {
  try { await f(); } catch (e) { check(name, false, String(e?.stack ?? e)); }
}

agents.setTracingDisabled(true);  // (its traces would go to OpenAI)
const agentsClient = new AgentsOpenAI({ baseURL, apiKey, maxRetries: 0 });
const agentModels = { 'chat completions': new OpenAIChatCompletionsModel(agentsClient, model),
  responses: new OpenAIResponsesModel(agentsClient, model) };
const llms = { OpenAI: new llamaindex.OpenAI({ model, apiKey, baseURL, temperature: 0, maxTokens: 40, maxRetries: 0 }),
  OpenAIResponses: new llamaindex.OpenAIResponses({ model, apiKey, baseURL, temperature: 0, maxOutputTokens: 40,
    maxRetries: 0 }) };

if (mode === 'tools') {
  for (const [api, agentModel] of Object.entries(agentModels))
    await attempt(`agents (${api}): a function tool`, async () => {
      const cities = [];
      const getWeather = agents.tool({ name: 'get_weather', description: 'Weather in a city',
        parameters: z.object({ city: z.string() }), execute: async ({ city }) => { cities.push(city); return '21 C, sunny'; } });
      const agent = new agents.Agent({ name: 'weather', instructions: 'Answer questions about the weather.',
        model: agentModel, tools: [getWeather], toolUseBehavior: 'stop_on_first_tool',
        modelSettings: { temperature: 0, maxTokens: 40 } });
      const result = await agents.run(agent, 'Weather in Paris?');
      check(`agents (${api}): the tool called with the model's arguments, its output the final output`,
        cities.length === 1 && cities[0] === 'Paris' && result.finalOutput === '21 C, sunny', { cities, out: result.finalOutput });
    });
  const weather = llamaTool({ name: 'get_weather', description: 'Weather in a city',
    parameters: z.object({ city: z.string() }), execute: ({ city }) => `21 C in ${city}` });
  for (const [name, llm] of Object.entries(llms))
    await attempt(`llamaindex ${name}: a tool call`, async () => {
      const r = await llm.chat({ messages: [{ role: 'user', content: 'Weather in Paris?' }], tools: [weather] });
      const calls = r.message.options?.toolCall ?? [];
      const input = typeof calls[0]?.input === 'string' ? JSON.parse(calls[0].input) : calls[0]?.input;
      check(`llamaindex ${name}: the call in message.options.toolCall`, calls.length === 1 &&
        calls[0].name === 'get_weather' && input?.city === 'Paris', r.message);
    });
  console.log(`agent clients (tools): ${passed} passed, ${failed} failed`);
  process.exit(failed ? 1 : 0);
}

if (mode === 'json') {
  for (const [api, agentModel] of Object.entries(agentModels))
    await attempt(`agents (${api}): an output type`, async () => {
      const agent = new agents.Agent({ name: 'json', instructions: 'Answer in JSON.', model: agentModel,
        outputType: z.object({ a: z.number() }), modelSettings: { temperature: 0, maxTokens: 40 } });
      const result = await agents.run(agent, 'Give me JSON');
      check(`agents (${api}): the final output parsed into its output type`, result.finalOutput?.a === 1,
        result.finalOutput);
    });
  const oai = new OpenAI({ baseURL, apiKey, maxRetries: 0 });
  for (const instructorMode of ['TOOLS', 'JSON_SCHEMA'])
    await attempt(`instructor ${instructorMode}`, async () => {
      const client = Instructor({ client: oai, mode: instructorMode });
      const thing = await client.chat.completions.create({ model, temperature: 0, max_tokens: 40, max_retries: 0,
        messages: [{ role: 'user', content: 'Give me JSON' }], response_model: { schema: z.object({ a: z.number() }),
          name: 'Thing' } });
      check(`instructor ${instructorMode}: the response_model filled`, thing?.a === 1, thing);
    });
  for (const [name, llm] of Object.entries(llms))
    await attempt(`llamaindex ${name}: chat, and streamed`, async () => {
      const messages = [{ role: 'user', content: 'Give me JSON' }];
      const r = await llm.chat({ messages });
      let text = '';
      for await (const chunk of await llm.chat({ messages, stream: true })) text += chunk.delta;
      // (OpenAIResponses leaves temperature out, so its two answers are sampled: each the model's own opening.)
      const same = name === 'OpenAI' ? text === r.message.content : text.startsWith('Sure');
      check(`llamaindex ${name}: the model's text whole and streamed`, typeof r.message.content === 'string' &&
        r.message.content.startsWith('Sure') && same, { whole: r.message.content, text });
    });
  console.log(`agent clients (json): ${passed} passed, ${failed} failed`);
  process.exit(failed ? 1 : 0);
}

console.log(`unknown mode '${mode}' (tools or json)`);
process.exit(2);
