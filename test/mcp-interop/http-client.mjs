// Drives an isopod-mcp --listen server with the official TypeScript MCP
// client over streamable HTTP and prints one JSON object on stdout: the
// tools it lists, a run with read_files and progress, a call without a
// token, and a call the client aborts. integration/fleet judges it.
//
// Usage: node http-client.mjs URL TOKEN; a line on stdin aborts the last
// call.
import { Client } from "@modelcontextprotocol/sdk/client/index.js";
import { StreamableHTTPClientTransport } from "@modelcontextprotocol/sdk/client/streamableHttp.js";

const [url, token] = process.argv.slice(2);
if (!url || !token) {
  console.error("usage: node http-client.mjs URL TOKEN");
  process.exit(2);
}

async function connect(tok) {
  const transport = new StreamableHTTPClientTransport(new URL(url), {
    requestInit: { headers: tok ? { Authorization: `Bearer ${tok}` } : {} },
  });
  const client = new Client({ name: "isopod-http-interop", version: "0.0.0" });
  await client.connect(transport);
  return client;
}

const out = {};
try {
  await connect("");
  out.no_token = "connected";
} catch (e) {
  out.no_token = String(e?.message ?? e);
}

const client = await connect(token);
out.tools = (await client.listTools()).tools.map((t) => t.name);

let progress = [];
const run = await client.callTool(
  {
    name: "sandbox_run",
    arguments: { cmd: "printf 'ab\\000cd' > /root/x.bin && echo ok", base: "base-min", read_files: ["/root/x.bin"] },
  },
  undefined,
  { onprogress: (p) => progress.push(p.message), timeout: 600000 },
);
out.run = { isError: run.isError ?? false, structured: run.structuredContent, progress };

// A call given up while its VM runs: the client sends
// notifications/cancelled; the server must tear the VM down.
const ac = new AbortController();
progress = [];
const cancelled = client
  .callTool(
    { name: "sandbox_run", arguments: { cmd: "sleep 600", base: "base-min", timeout_s: 900 } },
    undefined,
    { signal: ac.signal, timeout: 600000, onprogress: (p) => progress.push(p.message) },
  )
  .then(
    () => "completed",
    (e) => String(e?.message ?? e),
  );
// The caller says when, with a line on stdin (once the VM runs).
console.error("http-client: waiting for a line to abort the call");
await new Promise((r) => process.stdin.once("data", r));
ac.abort("test gives up");
out.cancel = { error: await cancelled, progress };
// The client sent notifications/cancelled (a dropped connection is no
// cancellation): wait, before closing, until the server has no live VM
// running the call, so that closing cannot cut the notification short.
const deadline = Date.now() + 60_000;
for (;;) {
  const r = await client.callTool({ name: "vm_list", arguments: {} });
  const live = (r.structuredContent?.vms ?? []).some((v) => v.live && (v.argv ?? []).join(" ").includes("sleep 600"));
  if (!live || Date.now() > deadline) {
    out.cancel.vmGone = !live;
    break;
  }
  await new Promise((res) => setTimeout(res, 200));
}
await client.close();
console.log(JSON.stringify(out));
process.exit(0);
