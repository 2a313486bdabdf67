// Drives an isopod-mcp --listen server with the official TypeScript MCP
// client over streamable HTTP, through the server's call streams, and
// prints one JSON object on stdout. internal/mcpserver's test judges it,
// against a server whose sandbox_run sleeps for "sleep N" and otherwise
// runs until it is cancelled.
//
// Usage: node http-streams.mjs URL TOKEN
//   resume:   a call whose POST response is cut after its first event with
//             an id, as a dropped connection would; the client must
//             reconnect with Last-Event-ID and get the result.
//   cancel:   a call the client aborts; nothing may arrive for it, until
//             its stream has ended.
//   shutdown: a call in flight when the server stops; "ready" on stderr
//             tells the test to stop it, and the call must be answered with
//             an error saying so.
import { Client } from "@modelcontextprotocol/sdk/client/index.js";
import { StreamableHTTPClientTransport } from "@modelcontextprotocol/sdk/client/streamableHttp.js";

const [url, token] = process.argv.slice(2);
if (!url || !token) {
  console.error("usage: node http-streams.mjs URL TOKEN");
  process.exit(2);
}

// Every exchange: method, Last-Event-ID, status, what came back, and a
// promise that settles when its body ends.
const exchanges = [];
let cutNext = false;

function hasIdEvent(text) {
  const events = text.split("\n\n");
  return events.slice(0, -1).some((ev) => ev.split("\n").some((l) => l.startsWith("id:")));
}

async function tapFetch(input, init) {
  const ex = { method: init?.method ?? "GET", lastEventId: null, body: "", call: null, cut: false };
  const headers = new Headers(init?.headers);
  ex.lastEventId = headers.get("last-event-id");
  if (typeof init?.body === "string" && init.body.includes('"tools/call"')) {
    ex.call = JSON.parse(init.body).id;
    ex.cut = cutNext;
    cutNext = false;
  }
  exchanges.push(ex);
  const resp = await fetch(input, init);
  ex.status = resp.status;
  if (!resp.body) {
    ex.ended = Promise.resolve();
    return resp;
  }
  const reader = resp.body.getReader();
  const decoder = new TextDecoder();
  let settle;
  ex.ended = new Promise((r) => (settle = r));
  const body = new ReadableStream({
    async pull(controller) {
      try {
        const { value, done } = await reader.read();
        if (done) {
          settle();
          controller.close();
          return;
        }
        ex.body += decoder.decode(value, { stream: true });
        controller.enqueue(value);
        if (ex.cut && hasIdEvent(ex.body)) {
          ex.dropped = true;
          await reader.cancel("the test drops the connection");
          settle();
          controller.error(new Error("the test dropped the connection"));
        }
      } catch (e) {
        settle();
        controller.error(e);
      }
    },
    cancel(reason) {
      settle();
      return reader.cancel(reason);
    },
  });
  return new Response(body, { status: resp.status, statusText: resp.statusText, headers: resp.headers });
}

const transport = new StreamableHTTPClientTransport(new URL(url), {
  requestInit: { headers: { Authorization: `Bearer ${token}` } },
  fetch: tapFetch,
  reconnectionOptions: { initialReconnectionDelay: 200, maxReconnectionDelay: 1000, reconnectionDelayGrowFactor: 1.5, maxRetries: 5 },
});
const client = new Client({ name: "isopod-http-streams", version: "0.0.0" });
const clientErrors = [];
client.onerror = (e) => clientErrors.push(String(e?.message ?? e));
await client.connect(transport);
// Every message the transport delivers, for the cancel step.
const seen = [];
const deliver = transport.onmessage;
transport.onmessage = (m, extra) => {
  seen.push(m);
  deliver?.(m, extra);
};

const out = { protocol: transport.protocolVersion ?? null };
const withTimeout = (p, ms) => Promise.race([p, new Promise((r) => setTimeout(() => r("timed out"), ms))]);

// resume
cutNext = true;
try {
  const r = await client.callTool({ name: "sandbox_run", arguments: { cmd: "sleep 2" } }, undefined, { timeout: 60_000 });
  out.resume = { isError: r.isError ?? false, structured: r.structuredContent ?? null };
} catch (e) {
  out.resume = { error: String(e?.message ?? e) };
}
out.resume.dropped = exchanges.some((ex) => ex.dropped === true);
out.resume.resumedWith = exchanges.filter((ex) => ex.method === "GET" && ex.lastEventId).map((ex) => [ex.lastEventId, ex.status]);

// cancel
{
  const ac = new AbortController();
  const call = client
    .callTool({ name: "sandbox_run", arguments: { cmd: "block" } }, undefined, {
      signal: ac.signal,
      timeout: 60_000,
      onprogress: () => ac.abort("the test gives up"),
    })
    .then(
      () => "completed",
      (e) => String(e?.message ?? e),
    );
  out.cancel = { error: await call };
  const ex = exchanges.findLast((x) => x.call !== null);
  out.cancel.streamEnded = (await withTimeout(ex.ended.then(() => "ended"), 15_000)) === "ended";
  // The client resumes a stream that ended without a result: wait for that
  // too, since an answer could come on it.
  const stream = /^id: ([^_\n]+)_/m.exec(ex.body)?.[1];
  const resumed = async () => {
    for (;;) {
      const get = exchanges.find((x) => x.method === "GET" && x.lastEventId?.startsWith(stream + "_") && x.ended);
      if (get) return get.ended;
      await new Promise((r) => setTimeout(r, 50));
    }
  };
  out.cancel.resumeEnded = stream ? (await withTimeout(resumed().then(() => "ended"), 10_000)) === "ended" : null;
  out.cancel.answers = seen.filter((m) => m.id === ex.call && ("result" in m || "error" in m)).length;
  out.cancel.body = ex.body;
}

// shutdown
{
  const call = client
    .callTool({ name: "sandbox_run", arguments: { cmd: "block" } }, undefined, {
      timeout: 60_000,
      onprogress: () => console.error("ready"),
    })
    .then(
      () => ({ completed: true }),
      (e) => ({ error: String(e?.message ?? e), code: e?.code ?? null }),
    );
  out.shutdown = await call;
}
out.clientErrors = clientErrors;
console.log(JSON.stringify(out));
process.exit(0);
