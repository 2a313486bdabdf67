// Drives an isopod-mcp server with the official TypeScript MCP client and
// prints one JSON object on stdout: the tools it lists and the result of each
// call asked for. The Go test in internal/mcpserver judges the output.
//
// Usage: node client.mjs SERVER_COMMAND CALLS_JSON [SERVER_ARGS...]
//   CALLS_JSON: [{"name": "sandbox_run", "arguments": {...}}, ...]
// The server inherits this process's environment and working directory.
import { Client } from "@modelcontextprotocol/sdk/client/index.js";
import { StdioClientTransport } from "@modelcontextprotocol/sdk/client/stdio.js";

const [command, callsJSON = "[]", ...args] = process.argv.slice(2);
if (!command) {
  console.error("usage: node client.mjs SERVER_COMMAND CALLS_JSON [SERVER_ARGS...]");
  process.exit(2);
}

const transport = new StdioClientTransport({
  command,
  args,
  env: { ...process.env },
  stderr: "inherit",
});
const client = new Client({ name: "isopod-interop", version: "0.0.0" });

try {
  await client.connect(transport);
  const listed = await client.listTools();
  const tools = listed.tools.map((t) => ({
    name: t.name,
    required: t.inputSchema.required ?? [],
    properties: Object.keys(t.inputSchema.properties ?? {}),
    hasOutputSchema: t.outputSchema !== undefined,
  }));
  const results = [];
  for (const call of JSON.parse(callsJSON)) {
    // A generous timeout: a run boots a whole VM.
    const r = await client.callTool(call, undefined, { timeout: 600_000 });
    results.push({
      name: call.name,
      isError: r.isError === true,
      text: r.content.filter((c) => c.type === "text").map((c) => c.text).join(""),
      structured: r.structuredContent ?? null,
    });
  }
  const info = client.getServerVersion();
  process.stdout.write(JSON.stringify({ server: info, tools, results }) + "\n");
} finally {
  await client.close();
}
