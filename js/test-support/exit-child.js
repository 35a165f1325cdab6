// Child process of test/exit.test.js: connects, makes calls, and leaves the client open. The
// process must still exit on its own once its work is done (no handle kept by an idle client).
import { SeppClient } from "sepp";

const url = process.argv[2];
const client = await SeppClient.connect(url);
const ack = await client.enqueue({ queue: "exit", jobType: "t" });
await client.reserve({ queues: ["exit"], leaseDurationMs: 1_000, waitTimeoutMs: 10 });
process.stdout.write(`${JSON.stringify(ack)}\n`);
// No client.close(): the test measures that the process exits anyway.
