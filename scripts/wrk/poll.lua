-- wrk script: every request polls a random ticket of the file named by TICKETS in the event
-- named by EVENT. done() prints the p99 and the answers that were not 2xx.
local tickets = {}

function init(args)
  for line in io.lines(os.getenv("TICKETS")) do
    table.insert(tickets, line)
  end
  prefix = "/v1/events/" .. os.getenv("EVENT") .. "/queue/"
  math.randomseed(os.time() + tonumber(tostring({}):sub(8), 16) % 100000)
end

function request()
  return wrk.format("GET", prefix .. tickets[math.random(#tickets)])
end

function done(summary, latency, requests)
  io.write(string.format("P99_MS %.2f\n", latency:percentile(99) / 1000))
  io.write(string.format("NON2XX %d\n", summary.errors.status))
end
