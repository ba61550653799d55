#!/usr/bin/env node
// AG-UI 1.0 interrupt and resume with the library's own client (@ag-ui/client@1.0.0).
//
// Usage:
//   node agui_approval.mjs <url> <runAgentInput-json | @file> <responses-json>
//     responses: {"<tool name>": ResumeResponse}, e.g. {"refund": {"status": "resolved",
//                "payload": {"approved": true}}} or {"refund": {"status": "cancelled"}}
//
// One HttpAgent runs twice on the thread. The first run (the given input) must end with
// RUN_FINISHED whose outcome is `interrupt`; the agent then holds them as pendingInterrupts (and
// refuses a run that leaves one unanswered). The script answers each interrupt by the tool it names
// (its metadata.tool), builds the resume list with the library's buildResumeArray, and runs again
// with runId "<runId>-resumed" and that resume list. Every raw wire event is checked against the
// library's EventSchemas (strict: library warnings are failures too), then goes through its
// verifier and reducer, as in agui_client.mjs.
//
// stdout: JSON {first: {outcome, interrupts, messages}, resume, second: {outcome, result, messages}}
// exit 0 ok | 1 usage/HTTP | 2 schema | 3 verifier | 4 RUN_ERROR | 5 other | 6 strict warning |
//      8 the first run did not end with an interrupt

import fs from 'node:fs';
import { HttpAgent, AGUIError, buildResumeArray } from '@ag-ui/client';
import { EventSchemas, RunAgentInputSchema } from '@ag-ui/core/schemas';
import { Observable } from 'rxjs';

const [url, bodyArg, responsesArg] = process.argv.slice(2);
if (!url || !bodyArg || !responsesArg) {
  console.error('usage: node agui_approval.mjs <url> <runAgentInput-json | @file> <responses-json>');
  process.exit(1);
}
const input = JSON.parse(bodyArg.startsWith('@') ? fs.readFileSync(bodyArg.slice(1), 'utf8') : bodyArg);
const responses = JSON.parse(responsesArg);
const parsedInput = RunAgentInputSchema.safeParse(input);
if (!parsedInput.success) {
  console.error('FAILED (usage): the given RunAgentInput is invalid:', parsedInput.error.message);
  process.exit(1);
}

const warnings = [];
const origWarn = console.warn;
console.warn = (...a) => {
  warnings.push(a.map(String).join(' '));
  origWarn('[warn]', ...a);
};
const origError = console.error;
console.error = (...a) => {
  if (typeof a[0] === 'string' && a[0].startsWith('Agent execution failed')) return;
  origError(...a);
};

class RawSchemaError extends Error {
  constructor(event, zodError) {
    super(`event (${event?.type}) fails EventSchemas: ${zodError.message}`);
    this.name = 'RawSchemaError';
  }
}

class ValidatingHttpAgent extends HttpAgent {
  run(runInput) {
    const wire$ = super.run(runInput);
    return new Observable(sub =>
      wire$.subscribe({
        next: ev => {
          const r = EventSchemas.safeParse(ev);
          if (!r.success) {
            sub.error(new RawSchemaError(ev, r.error));
            return;
          }
          sub.next(ev);
        },
        error: e => sub.error(e),
        complete: () => sub.complete(),
      }),
    );
  }
}

const agent = new ValidatingHttpAgent({
  url,
  threadId: input.threadId,
  initialMessages: input.messages ?? [],
  initialState: input.state ?? {},
});

let runError = null;
let finished = null;
const subscriber = {
  onRunErrorEvent: ({ event }) => {
    runError = event;
  },
  onRunFinishedEvent: params => {
    finished = params;
  },
};

function classify(err) {
  if (err?.name === 'RawSchemaError' || err?.name === 'ZodError' || err?.constructor?.name === 'ZodError')
    return 2;
  if (err instanceof SyntaxError) return 2;
  if (err instanceof AGUIError || err?.constructor?.name === 'AGUIError') return 3;
  if (/^HTTP \d+/.test(err?.message ?? '') || err?.status) return 1;
  return 5;
}

async function run(parameters) {
  runError = null;
  finished = null;
  const { result } = await agent.runAgent(parameters, subscriber);
  if (runError) {
    console.error(`FAILED (RUN_ERROR): ${runError.message} [code ${runError.code}]`);
    process.exit(4);
  }
  if (warnings.length > 0) {
    console.error(`FAILED (strict): ${warnings.length} library warning(s); first: ${warnings[0]}`);
    process.exit(6);
  }
  return { finished, result };
}

try {
  const common = { tools: input.tools, context: input.context, forwardedProps: input.forwardedProps };
  const first = await run({ runId: input.runId, ...common });
  if (first.finished?.outcome !== 'interrupt') {
    console.error(`FAILED: the first run ended ${first.finished?.outcome}, not with an interrupt`);
    process.exit(8);
  }
  const interrupts = agent.pendingInterrupts;
  const firstMessages = structuredClone(agent.messages);
  const answers = Object.fromEntries(interrupts.map(i => [i.id, responses[i.metadata?.tool]]));
  const resume = buildResumeArray(interrupts, answers);
  const second = await run({ runId: `${input.runId}-resumed`, ...common, resume });
  const summary = {
    first: { outcome: first.finished.event.outcome, interrupts, messages: firstMessages },
    resume,
    second: {
      outcome: second.finished?.event?.outcome ?? null,
      result: second.result ?? second.finished?.result,
      messages: agent.messages,
      pendingInterrupts: agent.pendingInterrupts,
    },
  };
  process.stdout.write(JSON.stringify(summary, null, 2) + '\n');
  process.exit(0);
} catch (err) {
  const code = classify(err);
  console.error(`FAILED (${code}): ${err?.name}: ${String(err?.message ?? err).slice(0, 600)}`);
  console.error('partial: ' + JSON.stringify({ messages: agent.messages }));
  process.exit(code);
}
