// What the client scripts share to read many runs in one process (`--batch <runs.json>`): loading
// the client library costs more than reading a stream, so a test's runs go through one process.
import fs from 'node:fs';

// Where a run's output goes: the process's own streams for a single run, buffers under --batch.
export function outputs(buffered) {
  const io = { warnings: [], stdout: [], stderr: [] };
  io.out = text => (buffered ? io.stdout.push(text) : process.stdout.write(text));
  io.err = (...a) => {
    const line = a.map(String).join(' ') + '\n';
    if (buffered) io.stderr.push(line);
    else process.stderr.write(line);
  };
  return io;
}

// Reads the runs in `file` (a JSON list), calls `run(item, io)` for each (one after another, or all
// at once with `together`), prints a JSON array of {"status", "stdout", "stderr"} and exits 0.
// `started(io)` is told which run's output the library's own console calls belong to.
export async function batch(file, run, { together = false, started = () => {} } = {}) {
  const items = JSON.parse(fs.readFileSync(file, 'utf8'));
  const one = async item => {
    const io = outputs(true);
    started(io);
    const status = await run(item, io);
    return { status, stdout: io.stdout.join(''), stderr: io.stderr.join('') };
  };
  const results = [];
  if (together) results.push(...(await Promise.all(items.map(one))));
  else for (const item of items) results.push(await one(item));
  process.stdout.write(JSON.stringify(results));
  process.exit(0);
}
