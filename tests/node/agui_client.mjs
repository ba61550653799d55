#!/usr/bin/env node
// AG-UI 1.0 test client (@ag-ui/client@1.0.0 + @ag-ui/core@1.0.0).
//
// Usage:
//   node agui_client.mjs <url> [runAgentInput-json | @file] [--lenient] [--verbose]
//   node agui_client.mjs --batch <runs.json> [--lenient] [--verbose]
//     runs.json: [{"url": ..., "body": RunAgentInput}, ...], run one after another in
//     this one process (the library loads once); stdout: a JSON array with, for each
//     run, {"status", "stdout", "stderr"}: what a single run exits with and prints.
//
// It POSTs a RunAgentInput with the library's own HttpAgent. HttpAgent builds
// the request body itself (threadId, runId, protocolVersion:"1.0", tools,
// context, forwardedProps, state, messages) from the agent's threadId /
// initialMessages / initialState and runAgent({runId, tools, context,
// forwardedProps, resume}); this script seeds those from the given JSON, so the
// body sent equals the given one (plus protocolVersion, minus role:"activity"
// messages).
//
// Pipeline that validates the response (all library code):
//   runHttpRequest -> transformHttpEventStream/parseSSEStream (SSE framing, JSON)
//   -> [strict only: EventSchemas.safeParse on every RAW wire event, so an
//       unknown event type or a legacy null is a schema failure (exit 2)]
//   -> CompatibilityBoundary -> enforceEvents (EventSchema.parse per type, strip
//   unknown keys) -> transformChunks (*_CHUNK expansion) -> verifyEvents
//   (ordering rules) -> defaultApplyEvents (messages/state reducer).
//
// By default the script is STRICT: things the library only warns about are
// failures too (unknown event type dropped, unknown property stripped, deprecated
// shape converted, reducer warnings such as a failed JSON patch, a stream that
// ends without RUN_FINISHED/RUN_ERROR). --lenient restores library behaviour.
//
// stdout (success only): JSON {threadId, runId, outcome, result, state, messages,
//                              newMessages, eventCount, custom}
// exit 0 ok | 1 usage/HTTP | 2 schema validation | 3 verifier/ordering |
//      4 RUN_ERROR received | 5 other stream error | 6 strict-mode warning |
//      7 strict: stream ended without RUN_FINISHED / RUN_ERROR

import fs from 'node:fs';
import { HttpAgent, AGUIError } from '@ag-ui/client';
import { EventSchemas, RunAgentInputSchema } from '@ag-ui/core/schemas';
import { Observable } from 'rxjs';
import { batch, outputs } from './batch.mjs';

const args = process.argv.slice(2);
const lenient = args.includes('--lenient');
const verbose = args.includes('--verbose');
const batched = args.includes('--batch');
const positional = args.filter(a => !a.startsWith('--'));
if (!positional[0]) {
  console.error('usage: node agui_client.mjs <url> [runAgentInput-json | @file] [--lenient] [--verbose]');
  console.error('       node agui_client.mjs --batch <runs.json> [--lenient] [--verbose]');
  process.exit(1);
}

const DEFAULT_INPUT = {
  threadId: 'thread-1',
  runId: 'run-1',
  state: {},
  messages: [{ id: 'user-1', role: 'user', content: 'Hello' }],
  tools: [
    {
      name: 'get_weather',
      description: 'Get the weather for a city',
      parameters: { type: 'object', properties: { city: { type: 'string' } }, required: ['city'] },
    },
  ],
  context: [],
  forwardedProps: {},
};

// Where a run's output goes (`outputs`): the library's console.warn / console.error calls go
// to the run being read (runs are read one at a time).
let current = outputs(false);
// ---- capture library warnings (strict mode turns them into failures) ----
console.warn = (...a) => {
  current.warnings.push(a.map(String).join(' '));
  current.err('[warn]', ...a);
};
// AbstractAgent.onError logs "Agent execution failed:" before rethrowing; keep it quiet
console.error = (...a) => {
  if (typeof a[0] === 'string' && a[0].startsWith('Agent execution failed') && !verbose) return;
  current.err(...a);
};

class RawSchemaError extends Error {
  constructor(event, zodError) {
    super(`event #${event.__index} (${event?.type}) fails EventSchemas: ${zodError.message}`);
    this.name = 'RawSchemaError';
  }
}

function classify(err) {
  if (err?.name === 'RawSchemaError' || err?.name === 'ZodError' || err?.constructor?.name === 'ZodError')
    return 2;
  if (err instanceof SyntaxError) return 2; // non-JSON data line
  if (/^Invalid event:/.test(err?.message ?? '')) return 2; // frame not an object / no type
  if (err instanceof AGUIError || err?.constructor?.name === 'AGUIError') return 3;
  if (/^(First |Cannot continue )/.test(err?.message ?? '')) return 3; // chunk expansion rules
  if (/^HTTP \d+/.test(err?.message ?? '') || err?.status) return 1;
  return 5;
}

// One run: POST `input` to `url`, read the response through the library; the exit status.
async function run(url, input, io) {
  // Validate the request with the library's own schema first.
  const parsedInput = RunAgentInputSchema.safeParse(input);
  if (!parsedInput.success) {
    io.err('FAILED (usage): the given RunAgentInput is invalid:', parsedInput.error.message);
    return 1;
  }

  let eventCount = 0;
  let sawTerminal = null; // 'RUN_FINISHED' | 'RUN_ERROR'
  class ValidatingHttpAgent extends HttpAgent {
    run(runInput) {
      const wire$ = super.run(runInput); // runHttpRequest + transformHttpEventStream
      return new Observable(sub =>
        wire$.subscribe({
          next: ev => {
            eventCount++;
            if (verbose) io.err('event', JSON.stringify(ev));
            // strict: validate the RAW wire event (before the library's compat shims
            // turn legacy nulls into absences / drop unknown event types)
            const r = lenient ? { success: true } : EventSchemas.safeParse(ev);
            if (!r.success) {
              Object.defineProperty(ev, '__index', { value: eventCount, enumerable: false });
              sub.error(new RawSchemaError(ev, r.error));
              return;
            }
            if (ev.type === 'RUN_FINISHED' || ev.type === 'RUN_ERROR') sawTerminal = ev.type;
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
  let outcome = null;
  let finishedResult;
  const custom = []; // CUSTOM events ({name, value}) as the library delivered them
  const subscriber = {
    onRunErrorEvent: ({ event }) => {
      runError = event;
    },
    onCustomEvent: ({ event }) => {
      custom.push({ name: event.name, value: event.value });
    },
    onRunFinishedEvent: params => {
      outcome = params.event.outcome ?? { type: params.outcome };
      finishedResult = params.result;
    },
  };

  try {
    const { result, newMessages } = await agent.runAgent(
      {
        runId: input.runId,
        tools: input.tools,
        context: input.context,
        forwardedProps: input.forwardedProps,
        ...(input.resume !== undefined ? { resume: input.resume } : {}),
      },
      subscriber,
    );

    const summary = {
      threadId: agent.threadId,
      runId: input.runId,
      outcome,
      result: result ?? finishedResult,
      state: agent.state,
      messages: agent.messages,
      newMessages,
      eventCount,
      custom,
    };

    if (runError) {
      io.err(`FAILED (RUN_ERROR): ${runError.message}${runError.code ? ` [code ${runError.code}]` : ''}`);
      io.err('partial: ' + JSON.stringify(summary));
      return 4;
    }
    if (!lenient && io.warnings.length > 0) {
      io.err(`FAILED (strict): ${io.warnings.length} library warning(s); first: ${io.warnings[0]}`);
      io.err('partial: ' + JSON.stringify(summary));
      return 6;
    }
    if (!lenient && sawTerminal == null) {
      io.err('FAILED (strict): stream ended without RUN_FINISHED or RUN_ERROR');
      io.err('partial: ' + JSON.stringify(summary));
      return 7;
    }
    io.err(`ok: ${eventCount} valid events, ${agent.messages.length} message(s)`);
    io.out(JSON.stringify(summary, null, 2) + '\n');
    return 0;
  } catch (err) {
    const code = classify(err);
    const kind = { 1: 'http', 2: 'schema validation', 3: 'verification/ordering', 5: 'stream' }[code];
    const msg = String(err?.message ?? err);
    io.err(`FAILED (${kind}): ${err?.name}: ${verbose ? msg : msg.slice(0, 600)}`);
    io.err('partial: ' + JSON.stringify({ messages: agent.messages, state: agent.state, eventCount }));
    return code;
  }
}

const read = arg => JSON.parse(arg.startsWith('@') ? fs.readFileSync(arg.slice(1), 'utf8') : arg);

if (batched) {
  await batch(positional[0], ({ url, body }, io) => run(url, body ?? DEFAULT_INPUT, io), {
    started: io => (current = io),
  });
} else {
  const [url, bodyArg] = positional;
  process.exit(await run(url, bodyArg == null ? DEFAULT_INPUT : read(bodyArg), current));
}
