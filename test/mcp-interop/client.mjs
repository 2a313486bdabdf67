// Drives an isopod-mcp server with the official TypeScript MCP client and
// prints one JSON object on stdout: the server's identity, the tools it
// lists and what each step gave. The Go test in internal/mcpserver judges
// the output.
//
// Usage: node client.mjs SERVER_COMMAND STEPS_JSON [SERVER_ARGS...]
//   STEPS_JSON is a list of steps, run in order on one session:
//     {"name": TOOL, "arguments": {...}}   a tool call
//     {"wait_ms": N}                       a pause (gives nothing)
//     {"raw": LINE}                        LINE written to the server's stdin
//                                          as it is; the step gives the next
//                                          line the server writes back
//     {"signal": "SIGTERM", "name": TOOL, "arguments": {...}}
//                                          starts the call, waits until
//                                          vm_list shows a live VM (with
//                                          "on_progress": true, until the
//                                          call's first progress
//                                          notification instead), signals
//                                          the server, times its exit and
//                                          gives what the call got (the
//                                          last step)
// The server inherits this process's environment and working directory.
import { Client } from "@modelcontextprotocol/sdk/client/index.js";
import { StdioClientTransport } from "@modelcontextprotocol/sdk/client/stdio.js";

const [command, stepsJSON = "[]", ...args] = process.argv.slice(2);
if (!command) {
  console.error("usage: node client.mjs SERVER_COMMAND STEPS_JSON [SERVER_ARGS...]");
  process.exit(2);
}

const transport = new StdioClientTransport({
  command,
  args,
  env: { ...process.env },
  stderr: "inherit",
});
const client = new Client({ name: "isopod-interop", version: "0.0.0" });
// What the client could not parse (the answers to raw lines) is reported
// here; the session goes on.
const clientErrors = [];
client.onerror = (e) => clientErrors.push(String(e?.message ?? e));

// Every line the server writes, as text, for the raw steps.
const lines = [];
let lineWaiters = [];
let exited = null;

function watchServer() {
  const proc = transport._process;
  let buf = "";
  proc.stdout.on("data", (chunk) => {
    buf += chunk.toString("utf8");
    let i;
    while ((i = buf.indexOf("\n")) >= 0) {
      lines.push(buf.slice(0, i));
      buf = buf.slice(i + 1);
      lineWaiters.forEach((w) => w());
      lineWaiters = [];
    }
  });
  proc.on("exit", (code, signal) => {
    exited = { at: Date.now(), code, signal };
  });
}

function nextLine(from, timeoutMs) {
  return new Promise((resolve) => {
    const timer = setTimeout(() => resolve(null), timeoutMs);
    const check = () => {
      if (lines.length > from) {
        clearTimeout(timer);
        return resolve(lines[from]);
      }
      lineWaiters.push(check);
    };
    check();
  });
}

const sleep = (ms) => new Promise((r) => setTimeout(r, ms));

function resultOf(name, r) {
  return {
    name,
    isError: r.isError === true,
    text: r.content.filter((c) => c.type === "text").map((c) => c.text).join(""),
    structured: r.structuredContent ?? null,
  };
}

async function rawStep(step) {
  const from = lines.length;
  transport._process.stdin.write(step.raw + "\n");
  const reply = await nextLine(from, 10_000);
  return { raw: step.raw.slice(0, 80), reply: reply === null ? null : JSON.parse(reply) };
}

// signalStep starts a call, waits for its VM to be live, signals the
// server and reports how long the server took to exit.
async function signalStep(step) {
  let progressed;
  const firstProgress = new Promise((r) => (progressed = r));
  const call = client
    .callTool({ name: step.name, arguments: step.arguments }, undefined, { timeout: 600_000, onprogress: () => progressed() })
    .then((r) => resultOf(step.name, r), (e) => ({ error: String(e?.message ?? e), code: e?.code ?? null }));
  const deadline = Date.now() + 300_000;
  let liveVM = null;
  if (step.on_progress) {
    await Promise.race([firstProgress, sleep(60_000)]);
  }
  while (!step.on_progress && !liveVM && Date.now() < deadline) {
    await sleep(200);
    const r = await client.callTool({ name: "vm_list", arguments: {} });
    liveVM = (r.structuredContent?.vms ?? []).find((v) => v.live) ?? null;
  }
  const pid = transport.pid;
  const sentAt = Date.now();
  process.kill(pid, step.signal);
  while (!exited && Date.now() - sentAt < 30_000) await sleep(20);
  return {
    signal: step.signal,
    serverPid: pid,
    liveVM: liveVM?.vm_id ?? null,
    exitMs: exited ? exited.at - sentAt : null,
    exitCode: exited?.code ?? null,
    call: await Promise.race([call, sleep(5000).then(() => ({ pending: true }))]),
  };
}

let out;
try {
  await client.connect(transport);
  watchServer();
  const listed = await client.listTools();
  const tools = listed.tools.map((t) => ({
    name: t.name,
    required: t.inputSchema.required ?? [],
    properties: Object.keys(t.inputSchema.properties ?? {}),
    types: Object.fromEntries(Object.entries(t.inputSchema.properties ?? {}).map(([k, v]) => [k, v.type ?? null])),
    hasOutputSchema: t.outputSchema !== undefined,
  }));
  const results = [];
  for (const step of JSON.parse(stepsJSON)) {
    if (step.wait_ms !== undefined) {
      await sleep(step.wait_ms);
      results.push({});
    } else if (step.raw !== undefined) {
      results.push(await rawStep(step));
    } else if (step.signal !== undefined) {
      results.push(await signalStep(step));
      break;
    } else {
      // A generous timeout: a run boots a whole VM.
      const r = await client.callTool(step, undefined, { timeout: 600_000 });
      results.push(resultOf(step.name, r));
    }
  }
  out = { server: client.getServerVersion(), tools, results, clientErrors };
} finally {
  await client.close();
}
// Timers still pending (the signal step's) must not hold the process.
process.stdout.write(JSON.stringify(out) + "\n", () => process.exit(0));
