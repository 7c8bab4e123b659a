// The official OpenAI Node client (npm `openai`, pinned in package.json)
// against `spindle serve --llm openai`, whose upstream is a small
// OpenAI-compatible server in this file that records every request.
// Run by run.sh: node sdk_test.mjs SPINDLE_BINARY. Exits 0 when every
// check passed; any failed check throws and exits 1. spindle is stopped
// on every way out.

import assert from "node:assert/strict";
import { spawn } from "node:child_process";
import http from "node:http";
import OpenAI from "openai";

const binary = process.argv[2];
if (!binary) {
  console.error("usage: node sdk_test.mjs SPINDLE_BINARY");
  process.exit(2);
}

// -- the upstream ----------------------------------------------------------

// Every chat request's body, in arrival order.
const seen = [];

// Replies "echo: <last user message>" in pieces over SSE; a model named
// "broken" gets a 500 in OpenAI's error shape. A request offering tools
// whose last message is the user's gets a call of its first tool, the
// arguments in pieces; a request ending with a tool result gets
// "tool said: <result>".
const upstream = http.createServer((req, res) => {
  let body = "";
  req.on("data", (c) => (body += c));
  req.on("end", () => {
    const request = JSON.parse(body);
    seen.push(request);
    if (request.model === "broken") {
      res.writeHead(500, { "Content-Type": "application/json" });
      res.end(JSON.stringify({ error: { message: "the model is broken", type: "server_error" } }));
      return;
    }
    const lastMessage = request.messages[request.messages.length - 1];
    const last = lastMessage.content;
    // spindle's query rewriter asks for a standalone query: the latest
    // message, unchanged.
    const rewrite = request.messages[0].content.startsWith("You rewrite");
    const text = rewrite ? last.slice(last.lastIndexOf("Latest message:\n") + 16)
      : lastMessage.role === "tool" ? "tool said: " + last : "echo: " + last;
    res.writeHead(200, { "Content-Type": "text/event-stream" });
    const send = (delta, finish = null) => res.write("data: " + JSON.stringify({
      id: "chatcmpl-up",
      object: "chat.completion.chunk",
      choices: [{ index: 0, delta, finish_reason: finish }],
    }) + "\n\n");
    if (request.tools && lastMessage.role === "user") {
      const args = JSON.stringify({ city: last, unit: "C" });
      send({ role: "assistant", tool_calls: [{ index: 0, id: "call_up_1", type: "function",
        function: { name: request.tools[0].function.name, arguments: "" } }] });
      for (let i = 0; i < args.length; i += 5)
        send({ tool_calls: [{ index: 0, function: { arguments: args.slice(i, i + 5) } }] });
      send({}, "tool_calls");
      res.end("data: [DONE]\n\n");
      return;
    }
    for (let i = 0; i < text.length; i += 4) {
      const chunk = {
        id: "chatcmpl-up",
        object: "chat.completion.chunk",
        choices: [{ index: 0, delta: { content: text.slice(i, i + 4) }, finish_reason: null }],
      };
      res.write("data: " + JSON.stringify(chunk) + "\n\n");
    }
    // The model "metered" reports its usage in OpenAI's last chunk when
    // asked for it; the others report none (spindle counts).
    if (request.model === "metered" && request.stream_options?.include_usage)
      res.write("data: " + JSON.stringify({
        id: "chatcmpl-up", object: "chat.completion.chunk", choices: [],
        usage: { prompt_tokens: 17, completion_tokens: 5, total_tokens: 22 },
      }) + "\n\n");
    res.end("data: [DONE]\n\n");
  });
});
await new Promise((ok) => upstream.listen(0, "127.0.0.1", ok));
const upstreamUrl = `http://127.0.0.1:${upstream.address().port}`;

// -- spindle ---------------------------------------------------------------

// Through util-linux's setpriv, spindle gets SIGKILL when this process
// dies, also when it is killed (a CTest timeout) and cannot stop it.
const server = spawn("setpriv", ["--pdeathsig", "KILL", binary,
  "serve", "--port", "0", "--data", ":memory:", "--log-level", "warn",
  "--llm", "openai", "--llm-url", upstreamUrl, "--llm-model", "upstream-default",
], { stdio: ["ignore", "pipe", "inherit"] });
const stop = () => {
  if (server.exitCode === null) server.kill("SIGKILL");
};
process.on("exit", stop);
for (const sig of ["SIGINT", "SIGTERM"]) process.on(sig, () => process.exit(1));

const base = await new Promise((ok, fail) => {
  let out = "";
  const timer = setTimeout(() => fail(new Error("spindle printed no address in 30 s")), 30000);
  server.stdout.on("data", (d) => {
    out += d;
    const m = out.match(/serving on (http:\/\/[0-9.]+:\d+)/);
    if (m) {
      clearTimeout(timer);
      ok(m[1]);
    }
  });
  server.on("exit", (code) => fail(new Error(`spindle exited with ${code}`)));
});

const client = new OpenAI({ baseURL: base + "/v1", apiKey: "not-checked", maxRetries: 0 });

// The chat requests (not the query rewriter's) whose last message is `text`.
const chatRequestsEndingWith = (text) =>
  seen.filter((r) => !r.messages[0].content.startsWith("You rewrite")
    && r.messages[r.messages.length - 1].content === text);

let checks = 0;
async function check(name, f) {
  await f();
  ++checks;
  console.log("ok - " + name);
}

try {
  await check("a completion without a thread passes the messages through", async () => {
    const r = await client.chat.completions.create({
      model: "gpt-test",
      messages: [
        { role: "system", content: "Be brief." },
        { role: "user", content: "hello there" },
      ],
      temperature: 0.25,
    });
    assert.equal(r.object, "chat.completion");
    assert.equal(r.choices.length, 1);
    assert.equal(r.choices[0].message.role, "assistant");
    assert.equal(r.choices[0].message.content, "echo: hello there");
    assert.equal(r.choices[0].finish_reason, "stop");
    assert.equal(r.model, "gpt-test");
    assert.equal(r.thread_id, undefined);
    const [up] = chatRequestsEndingWith("hello there");
    assert.deepEqual(up.messages, [
      { role: "system", content: "Be brief." },
      { role: "user", content: "hello there" },
    ]);
    assert.equal(up.model, "gpt-test");
    assert.equal(up.temperature, 0.25);
  });

  await check("a streamed completion arrives as chunks and ends", async () => {
    const stream = await client.chat.completions.create({
      model: "gpt-test",
      messages: [{ role: "user", content: "stream this please" }],
      stream: true,
    });
    let text = "";
    let finish = null;
    let chunks = 0;
    for await (const chunk of stream) {
      assert.equal(chunk.object, "chat.completion.chunk");
      ++chunks;
      text += chunk.choices[0].delta.content ?? "";
      finish = chunk.choices[0].finish_reason ?? finish;
    }
    assert.equal(text, "echo: stream this please");
    assert.equal(finish, "stop");
    assert.ok(chunks >= 4, `only ${chunks} chunks`);
  });

  await check("usage: the completion's usage, and with include_usage the stream's last chunk", async () => {
    // An upstream that reports its usage: passed through as it came.
    const plain = await client.chat.completions.create({
      model: "metered",
      messages: [{ role: "user", content: "count me" }],
    });
    assert.deepEqual(plain.usage, { prompt_tokens: 17, completion_tokens: 5, total_tokens: 22 });
    assert.equal(seen[seen.length - 1].stream_options.include_usage, true);
    const stream = await client.chat.completions.create({
      model: "metered",
      messages: [{ role: "user", content: "count me too" }],
      stream: true,
      stream_options: { include_usage: true },
    });
    let usage = null;
    let text = "";
    for await (const chunk of stream) {
      if (chunk.usage) {
        assert.deepEqual(chunk.choices, []);
        usage = chunk.usage;
      } else {
        assert.equal(chunk.usage, null);
        text += chunk.choices[0].delta.content ?? "";
      }
    }
    assert.equal(text, "echo: count me too");
    assert.deepEqual(usage, { prompt_tokens: 17, completion_tokens: 5, total_tokens: 22 });
    // An upstream that reports none: counted by spindle, in a thread too.
    const counted = await client.chat.completions.create({
      model: "gpt-test",
      messages: [{ role: "user", content: "count me" }],
      thread_id: "sdk-usage-" + process.pid,
    });
    assert.ok(counted.usage.prompt_tokens > 0, JSON.stringify(counted.usage));
    assert.ok(counted.usage.completion_tokens > 0, JSON.stringify(counted.usage));
    assert.equal(counted.usage.total_tokens,
      counted.usage.prompt_tokens + counted.usage.completion_tokens);
  });

  const thread = "sdk-thread-" + process.pid;
  await check("a completion in a thread is stored and names its thread", async () => {
    const { data, response } = await client.chat.completions
      .create({
        model: "gpt-test",
        messages: [{ role: "user", content: "my name is Ada" }],
        thread_id: thread,
      })
      .withResponse();
    assert.equal(data.choices[0].message.content, "echo: my name is Ada");
    assert.equal(data.thread_id, thread);
    assert.equal(response.headers.get("spindle-thread-id"), thread);
  });

  await check("a streamed follow-up in the thread reaches the upstream with both earlier turns in order", async () => {
    const stream = await client.chat.completions.create({
      model: "gpt-test",
      messages: [
        { role: "system", content: "You are terse." },
        { role: "user", content: "what is my name?" },
      ],
      stream: true,
      thread_id: thread,
    });
    let text = "";
    for await (const chunk of stream) {
      assert.equal(chunk.thread_id, thread);
      text += chunk.choices[0].delta.content ?? "";
    }
    const ups = chatRequestsEndingWith("what is my name?");
    assert.equal(ups.length, 1, "one chat request for the follow-up");
    const msgs = ups[0].messages;
    assert.deepEqual(msgs[0], { role: "system", content: "You are terse." });
    const first = msgs.findIndex((m) => m.role === "user" && m.content === "my name is Ada");
    const reply = msgs.findIndex((m) => m.role === "assistant" && m.content === "echo: my name is Ada");
    assert.ok(first > 0 && reply === first + 1 && reply < msgs.length - 1,
      "history in order: " + JSON.stringify(msgs));
    assert.equal(text, "echo: what is my name?");
    // spindle stored all four turns.
    const history = await (await fetch(`${base}/v1/threads/${thread}/history`)).json();
    assert.deepEqual(history.turns.map((t) => [t.role, t.content]), [
      ["user", "my name is Ada"],
      ["assistant", "echo: my name is Ada"],
      ["user", "what is my name?"],
      ["assistant", "echo: what is my name?"],
    ]);
  });

  await check("a tool call round trip in a thread is stored whole", async () => {
    const toolThread = "sdk-tools-" + process.pid;
    const tools = [{
      type: "function",
      function: {
        name: "weather",
        description: "The weather in a city",
        parameters: { type: "object", properties: { city: { type: "string" } }, required: ["city"] },
      },
    }];
    const messages = [{ role: "user", content: "Oslo" }];
    // The call streams in pieces; the client's own helper puts it together.
    const stream = client.chat.completions.stream({
      model: "gpt-test", messages, tools, tool_choice: "auto", thread_id: toolThread,
    });
    const asked = await stream.finalChatCompletion();
    const choice = asked.choices[0];
    assert.equal(choice.finish_reason, "tool_calls");
    assert.equal(choice.message.tool_calls.length, 1);
    const call = choice.message.tool_calls[0];
    assert.equal(call.id, "call_up_1");
    assert.equal(call.type, "function");
    assert.equal(call.function.name, "weather");
    assert.deepEqual(JSON.parse(call.function.arguments), { city: "Oslo", unit: "C" });
    // As OpenAI writes it (the client's helper adds fields of its own).
    const wire = { id: call.id, type: "function", function: { name: "weather", arguments: call.function.arguments } };
    const [offered] = seen.filter((r) => r.tools && r.messages.at(-1).content === "Oslo");
    assert.deepEqual(offered.tools, tools);
    assert.equal(offered.tool_choice, "auto");

    // The client runs the tool and sends the result back.
    messages.push(choice.message);
    messages.push({ role: "tool", tool_call_id: call.id, content: "3C and clear" });
    const answered = await client.chat.completions.create({
      model: "gpt-test", messages, tools, thread_id: toolThread,
    });
    assert.equal(answered.choices[0].finish_reason, "stop");
    assert.equal(answered.choices[0].message.content, "tool said: 3C and clear");
    const [followed] = seen.filter((r) => r.messages.at(-1).role === "tool"
      && r.messages.at(-1).content === "3C and clear");
    const at = followed.messages.findIndex((m) => m.tool_calls);
    assert.deepEqual(followed.messages.slice(at), [
      { role: "assistant", content: null, tool_calls: [wire] },
      { role: "tool", content: "3C and clear", tool_call_id: "call_up_1" },
    ]);

    const history = await (await fetch(`${base}/v1/threads/${toolThread}/history`)).json();
    assert.deepEqual(history.turns.map((t) => [t.role, t.content, t.tool_calls ?? null, t.tool_call_id ?? null]), [
      ["user", "Oslo", null, null],
      ["assistant", "", [wire], null],
      ["tool", "3C and clear", null, "call_up_1"],
      ["assistant", "tool said: 3C and clear", null, null],
    ]);
  });

  await check("a bad thread ID is an APIError with status 400", async () => {
    await assert.rejects(
      client.chat.completions.create({
        model: "gpt-test",
        messages: [{ role: "user", content: "hi" }],
        thread_id: "../etc",
      }),
      (e) => {
        assert.ok(e instanceof OpenAI.APIError, String(e));
        assert.equal(e.status, 400);
        assert.equal(e.type, "invalid_request_error");
        assert.equal(e.code, "invalid_id");
        return true;
      });
  });

  await check("an unknown request argument is an APIError with status 400 naming it", async () => {
    await assert.rejects(
      client.chat.completions.create({
        model: "gpt-test",
        messages: [{ role: "user", content: "hi" }],
        frobnicate: true,
      }),
      (e) => {
        assert.ok(e instanceof OpenAI.BadRequestError, String(e));
        assert.equal(e.param, "frobnicate");
        return true;
      });
  });

  await check("an upstream failure is an APIError with status 502, plain and streamed", async () => {
    await assert.rejects(
      client.chat.completions.create({ model: "broken", messages: [{ role: "user", content: "hi" }] }),
      (e) => {
        assert.ok(e instanceof OpenAI.APIError, String(e));
        assert.equal(e.status, 502);
        assert.equal(e.code, "upstream_failure");
        return true;
      });
    await assert.rejects(async () => {
      const stream = await client.chat.completions.create({
        model: "broken", messages: [{ role: "user", content: "hi" }], stream: true,
      });
      for await (const _ of stream) {
        // the error arrives as an event
      }
    }, (e) => {
      assert.ok(e instanceof OpenAI.APIError, String(e));
      assert.match(e.message, /the model is broken/);
      assert.equal(e.code, "upstream_failure");
      assert.equal(e.type, "api_error");
      return true;
    });
  });
} finally {
  stop();
  upstream.close();
}
console.log(`all ${checks} checks passed`);
process.exit(0);
