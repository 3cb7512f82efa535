-- wrk script: every request enters a new user, `w<thread>-<n>` (n from 1 in each thread), into
-- the event named by the EVENT environment variable. done() prints each thread's count, from
-- which `waitroom-bench tickets` derives the tickets for the poll run.
-- `id` and `counter` are globals: wrk's thread:set and thread:get reach only globals.
local threads = {}
counter = 0

function setup(thread)
  thread:set("id", #threads)
  table.insert(threads, thread)
end

function init(args)
  path = "/v1/events/" .. os.getenv("EVENT") .. "/queue"
end

function request()
  counter = counter + 1
  return wrk.format("POST", path, {["Content-Type"] = "application/json"},
    '{"user_id":"w' .. id .. '-' .. counter .. '"}')
end

function done(summary, latency, requests)
  local counts = {}
  for _, t in ipairs(threads) do
    table.insert(counts, t:get("counter"))
  end
  io.write("COUNTS " .. table.concat(counts, ",") .. "\n")
  io.write(string.format("P99_MS %.2f\n", latency:percentile(99) / 1000))
  io.write(string.format("NON2XX %d\n", summary.errors.status))
end
