// Child process of test/worker-exit.test.js: runs a Worker on one queue and leaves its client
// open (no close(), no process.exit()): the process must end on its own once the worker stops.
//
//   node worker-child.js URL QUEUE signal   runs until SIGTERM; each handler takes 300 ms
//   node worker-child.js URL QUEUE stop     stops the worker (from outside its handler) after one job
//
// Prints `started <jobId>` and `finished <jobId>` per job and `report <json>` at the end.
import { SeppClient, Worker } from "sepp";
import { setTimeout as sleep } from "node:timers/promises";

const [url, queue, mode] = process.argv.slice(2);
const client = await SeppClient.connect(url);
const worker = new Worker(client, { queues: [queue] });
/** @type {() => void} */
let handledOne = () => {};
const firstJob = new Promise((resolve) => {
  handledOne = () => resolve(undefined);
});
worker.handle("t", async (job) => {
  process.stdout.write(`started ${job.id}\n`);
  if (mode === "signal") await sleep(300);
  process.stdout.write(`finished ${job.id}\n`);
  handledOne();
});
const running = worker.run();
if (mode === "stop") {
  await firstJob;
  await worker.stop();
}
process.stdout.write(`report ${JSON.stringify(await running)}\n`);
