// Tool calls through the official OpenAI client, on a tiny model that
// tests/cli/serve.sh fine-tuned for a few steps (whale sft) to answer the
// weather question with Qwen2.5's `<tool_call>` block: whole replies parsed
// into message.tool_calls, streamed ones as OpenAI's tool-call deltas
// (assembled by the client's own stream helper), tool_choice, a
// conversation carrying the call and its result, malformed calls as text,
// and the errors. SERVE_TOOLS_URL / SERVE_TOOLS_DIR: that server and folder.
import fs from 'node:fs';
import OpenAI from 'openai';
import { env, check, finish, whale } from './lib.mjs';

const url = process.env.SERVE_TOOLS_URL, dir = process.env.SERVE_TOOLS_DIR;
const client = new OpenAI({ baseURL: url + '/v1', apiKey: env.key, maxRetries: 0 });
const model = dir.split('/').filter(Boolean).pop();
const tools = [{ type: 'function', function: { name: 'get_weather', description: 'Current weather',
  parameters: { type: 'object', properties: { city: { type: 'string' } }, required: ['city'] } } },
{ type: 'function', function: { name: 'get_time', parameters: { type: 'object', properties: {} } } }];
const messages = [{ role: 'user', content: 'What is the weather in Paris?' }];
const base = { model, messages, tools, temperature: 0, max_tokens: 40 };
const wantArgs = { city: 'Paris' };
const isWeatherCall = (calls) => Array.isArray(calls) && calls.length === 1 && calls[0].type === 'function' &&
  typeof calls[0].id === 'string' && calls[0].function.name === 'get_weather' &&
  JSON.stringify(JSON.parse(calls[0].function.arguments)) === JSON.stringify(wantArgs);

// whole
const r = await client.chat.completions.create(base);
const m = r.choices[0].message;
check('whole: one tool call, get_weather {"city": "Paris"}', isWeatherCall(m.tool_calls), JSON.stringify(m));
check('whole: finish_reason tool_calls, content null', r.choices[0].finish_reason === 'tool_calls' &&
      m.content === null, JSON.stringify(r.choices[0]));

// streamed: raw deltas as OpenAI sends them
const raw = await client.chat.completions.create({ ...base, stream: true });
const deltas = [];
let finishReason = null, contentText = '';
for await (const c of raw) {
  const ch = c.choices[0];
  if (!ch) continue;
  if (ch.delta.tool_calls) deltas.push(...ch.delta.tool_calls);
  contentText += ch.delta.content ?? '';
  if (ch.finish_reason) finishReason = ch.finish_reason;
}
const head = deltas[0] ?? {};
check('stream: the first delta names the call', head.index === 0 && typeof head.id === 'string' &&
      head.type === 'function' && head.function?.name === 'get_weather' && head.function?.arguments === '',
      JSON.stringify(head));
const frags = deltas.slice(1);
// (as many fragments as the text had grown by when the stream took it: test_serve_stream feeds it byte by byte)
check('stream: then the arguments', frags.length >= 1 && frags.every((d) => d.index === 0 &&
      d.id === undefined && typeof d.function.arguments === 'string'), JSON.stringify(frags));
check('stream: the fragments join into the arguments', JSON.stringify(JSON.parse(frags.map((d) =>
      d.function.arguments).join(''))) === JSON.stringify(wantArgs), JSON.stringify(frags));
check('stream: finish_reason tool_calls, no content', finishReason === 'tool_calls' && contentText === '',
      JSON.stringify([finishReason, contentText]));
// the client's own stream helper assembles the same message
const helper = client.chat.completions.stream({ ...base });
const final = await helper.finalChatCompletion();
check('stream helper: the assembled message has the call', isWeatherCall(final.choices[0].message.tool_calls) &&
      final.choices[0].finish_reason === 'tool_calls', JSON.stringify(final.choices[0]));

// tool_choice
const req = await client.chat.completions.create({ ...base, tool_choice: 'required' });
check('tool_choice required: the call', isWeatherCall(req.choices[0].message.tool_calls),
      JSON.stringify(req.choices[0].message));
const named = await client.chat.completions.create({ ...base,
  tool_choice: { type: 'function', function: { name: 'get_weather' } } });
check('tool_choice named: the call', isWeatherCall(named.choices[0].message.tool_calls) &&
      named.choices[0].finish_reason === 'tool_calls', JSON.stringify(named.choices[0].message));
let namedStream = await client.chat.completions.stream({ ...base,
  tool_choice: { type: 'function', function: { name: 'get_weather' } } }).finalChatCompletion();
check('tool_choice named, streamed: the call', isWeatherCall(namedStream.choices[0].message.tool_calls),
      JSON.stringify(namedStream.choices[0].message));
const none = await client.chat.completions.create({ ...base, tool_choice: 'none' });
check('tool_choice none: no tool calls', none.choices[0].message.tool_calls === undefined &&
      typeof none.choices[0].message.content === 'string' && none.choices[0].finish_reason !== 'tool_calls');

// a call cut short (a stop string inside its head) is malformed: it comes back as text, whole and streamed
const cut = await client.chat.completions.create({ ...base, stop: ['get_weather'] });
check('malformed call: text, finish_reason stop', cut.choices[0].message.tool_calls === undefined &&
      cut.choices[0].message.content.startsWith('<tool_call>') && cut.choices[0].finish_reason === 'stop',
      JSON.stringify(cut.choices[0]));
let cutText = '', cutCalls = 0;
for await (const c of await client.chat.completions.create({ ...base, stop: ['get_weather'], stream: true })) {
  cutText += c.choices[0]?.delta?.content ?? '';
  cutCalls += c.choices[0]?.delta?.tool_calls ? 1 : 0;
}
check('malformed call, streamed: the same text', cutCalls === 0 && cutText === cut.choices[0].message.content,
      JSON.stringify(cutText));

// the conversation goes on: the assistant's call (arguments as OpenAI's JSON string) and the tool's result
const call = m.tool_calls?.[0] ?? { id: 'call_0', type: 'function', function: { name: 'get_weather',
  arguments: '{"city": "Paris"}' } };
const convo = [...messages, { role: 'assistant', content: null, tool_calls: [call] },
  { role: 'tool', tool_call_id: call.id, content: '{"temperature": 21}' }];
const next = await client.chat.completions.create({ ...base, messages: convo, max_tokens: 4 });
check('a tool result in the conversation: accepted', next.choices[0].message.role === 'assistant');
// rendered as the template renders the call with its arguments as an object (as transformers is given them)
const f = `${env.tmp}/tool-convo.json`, tf = `${env.tmp}/tool-tools.json`;
fs.writeFileSync(f, JSON.stringify(convo.map((x) => x.tool_calls ? { ...x, content: '', tool_calls: x.tool_calls.map(
  (t) => ({ ...t, function: { ...t.function, arguments: JSON.parse(t.function.arguments) } })) } : x)));
fs.writeFileSync(tf, JSON.stringify(tools));
const want = JSON.parse(whale('chat-template', '-m', dir, '--messages', f, '--tools', tf, '--add-generation-prompt',
                              '--ids'));
check('a tool result in the conversation: the prompt is the template\'s', next.usage.prompt_tokens === want.length,
      `${next.usage.prompt_tokens} vs ${want.length}`);

// errors
async function rejects(what, body, param) {
  try {
    await client.chat.completions.create({ ...base, ...body });
    check(what, false, 'no error');
  } catch (e) {
    check(what, e.status === 400 && e.param === param, `${e.status} ${e.param} ${e.message}`);
  }
}
await rejects('tool_choice naming an unknown function: 400',
              { tool_choice: { type: 'function', function: { name: 'launch' } } }, 'tool_choice');
await rejects('tool_choice required without tools: 400', { tools: undefined, tool_choice: 'required' }, 'tool_choice');
await rejects('tool_choice "sometimes": 400', { tool_choice: 'sometimes' }, 'tool_choice');
await rejects('tools not an array: 400', { tools: { type: 'function' } }, 'tools');
await rejects('a tool without a name: 400', { tools: [{ type: 'function', function: {} }] }, 'tools');
await rejects('a malformed assistant tool call: 400',
              { messages: [...messages, { role: 'assistant', tool_calls: [{ type: 'function' }] }] }, 'messages');

finish('serve-tools');
