# CloudWatch alarms per node, mirroring the operators' thresholds (shared/seeds 003, issue 13):
# engine CPU (command capacity) above 70 %, memory above 80 % of maxmemory, more than 200
# connected clients, and replication lag. ElastiCache publishes these per node
# (CacheClusterId); in cluster mode the nodes are named <group>-<shard 4 digits>-<node 3 digits>,
# so the ids are known before the group exists. After a scale-in that removed a middle shard,
# compare with the replication group's member_clusters output.

locals {
  node_ids = toset(flatten([
    for shard in range(1, var.num_node_groups + 1) : [
      for node in range(1, var.replicas_per_node_group + 2) : format("%s-%04d-%03d", var.name, shard, node)
    ]
  ]))

  node_alarms = {
    engine-cpu = {
      metric      = "EngineCPUUtilization"
      statistic   = "Maximum"
      threshold   = var.engine_cpu_alarm_percent
      periods     = 3
      description = "engine thread above ${var.engine_cpu_alarm_percent} % of one core for 3 minutes: the node's command capacity is nearly used; add shards (docs/deploy.md, scale-up)"
    }
    memory = {
      metric      = "DatabaseMemoryUsagePercentage"
      statistic   = "Maximum"
      threshold   = var.memory_alarm_percent
      periods     = 2
      description = "used memory above ${var.memory_alarm_percent} % of maxmemory; with noeviction, enters fail at 100 %: add shards or a larger node type"
    }
    connections = {
      metric      = "CurrConnections"
      statistic   = "Maximum"
      threshold   = var.connections_alarm_count
      periods     = 2
      description = "more than ${var.connections_alarm_count} client connections on one node: check task count and connection reuse"
    }
    replication-lag = {
      metric      = "ReplicationLag"
      statistic   = "Maximum"
      threshold   = var.replication_lag_alarm_seconds
      periods     = 3
      description = "replica more than ${var.replication_lag_alarm_seconds} s behind its primary: replica reads are stale and a failover would lose recent writes"
    }
  }

  node_alarm_pairs = {
    for pair in setproduct(keys(local.node_alarms), local.node_ids) : "${pair[1]}/${pair[0]}" => {
      alarm = pair[0]
      node  = pair[1]
    }
  }

  # Commands waitroom sends: scripts (EVALSHA), sorted-set reads, string and key commands.
  ops_metrics = ["EvalBasedCmds", "SortedSetBasedCmds", "StringBasedCmds", "KeyBasedCmds"]
}

resource "aws_cloudwatch_metric_alarm" "node" {
  for_each = local.node_alarm_pairs

  alarm_name          = "${each.value.node}-${each.value.alarm}"
  alarm_description   = "waitroom ${var.name} node ${each.value.node}: ${local.node_alarms[each.value.alarm].description}"
  namespace           = "AWS/ElastiCache"
  metric_name         = local.node_alarms[each.value.alarm].metric
  statistic           = local.node_alarms[each.value.alarm].statistic
  dimensions          = { CacheClusterId = each.value.node }
  period              = 60
  evaluation_periods  = local.node_alarms[each.value.alarm].periods
  threshold           = local.node_alarms[each.value.alarm].threshold
  comparison_operator = "GreaterThanThreshold"
  treat_missing_data  = "notBreaching"
  alarm_actions       = var.alarm_actions
  ok_actions          = var.alarm_actions
  tags                = var.tags

  depends_on = [aws_elasticache_replication_group.this]
}

resource "aws_cloudwatch_metric_alarm" "ops" {
  for_each = var.node_ops_capacity > 0 ? local.node_ids : toset([])

  alarm_name          = "${each.key}-ops"
  alarm_description   = "waitroom ${var.name} node ${each.key}: commands per second above 70 % of the measured node capacity (${var.node_ops_capacity}/s)"
  evaluation_periods  = 3
  threshold           = 0.7 * var.node_ops_capacity
  comparison_operator = "GreaterThanThreshold"
  treat_missing_data  = "notBreaching"
  alarm_actions       = var.alarm_actions
  ok_actions          = var.alarm_actions
  tags                = var.tags

  metric_query {
    id          = "ops"
    expression  = "(${join(" + ", [for i, m in local.ops_metrics : "m${i}"])}) / 60"
    label       = "commands per second"
    return_data = true
  }

  dynamic "metric_query" {
    for_each = local.ops_metrics
    content {
      id = "m${metric_query.key}"
      metric {
        namespace   = "AWS/ElastiCache"
        metric_name = metric_query.value
        dimensions  = { CacheClusterId = each.key }
        period      = 60
        stat        = "Sum"
      }
    }
  }

  depends_on = [aws_elasticache_replication_group.this]
}
