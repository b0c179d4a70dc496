package metrics

import "github.com/prometheus/client_golang/prometheus"

// Family describes one rlhub_* metric family: the table in docs/metrics.md
// lists exactly these.
type Family struct {
	Name   string
	Type   string // counter, gauge or histogram
	Labels []string
	Help   string
}

// The families, grouped by source. Order is the docs table's.
var (
	fReducerPushed   = Family{"rlhub_reducer_gradients_pushed_total", "counter", nil, "Gradients pushed to the secondaries hosted here."}
	fReducerReduced  = Family{"rlhub_reducer_gradients_reduced_total", "counter", nil, "Gradients forwarded in a batch to, and accepted by, the primary."}
	fReducerApplied  = Family{"rlhub_reducer_gradients_applied_total", "counter", nil, "Gradients applied by an optimizer step at the primary hosted here."}
	fReducerDropped  = Family{"rlhub_reducer_gradients_dropped_total", "counter", []string{"reason"}, "Gradients dropped, by reason (invalid, nonfinite, stale, duplicate, queue_full, unknown_model, aborted, publish_failed, step_nonfinite); lost ones are rlhub_reducer_gradients_lost."}
	fReducerLost     = Family{"rlhub_reducer_gradients_lost", "gauge", nil, "Gradients acknowledged but lost with their secondary; falls when a client's retry of one is applied (docs/reducer.md)."}
	fReducerSteps    = Family{"rlhub_reducer_steps_total", "counter", nil, "Optimizer steps (versions published) by the primary hosted here."}
	fReducerQueue    = Family{"rlhub_reducer_queue_depth", "gauge", nil, "Gradients held in the secondaries' bounded queues."}
	fReducerLatency  = Family{"rlhub_reducer_publish_latency_seconds", "histogram", nil, "Time from a batch's first gradient admitted to its step published, at the primary."}
	fReducerModelVer = Family{"rlhub_reducer_model_version", "gauge", []string{"model"}, "Newest version the primary published of each model it manages."}
	fReducerModelApp = Family{"rlhub_reducer_model_applied_total", "counter", []string{"model"}, "Gradients applied to each model by the primary."}
	fReducerModelOpt = Family{"rlhub_reducer_model_optimizer_steps", "gauge", []string{"model"}, "Each model's optimizer step count (its schedule position; restored with the registration)."}
	fStoreVersion    = Family{"rlhub_store_model_version", "gauge", []string{"model"}, "Newest version of each model in the store."}
	fStoreBytes      = Family{"rlhub_store_model_bytes", "gauge", []string{"model"}, "Size of each model's newest version (safetensors bytes)."}
	fStoreRetained   = Family{"rlhub_store_retained_bytes", "gauge", []string{"model"}, "Bytes of every retained version of each model."}
	fStorePushes     = Family{"rlhub_store_pushes_total", "counter", []string{"model"}, "Versions that landed in the store since it opened."}
	fStoreRefused    = Family{"rlhub_store_pushes_refused_total", "counter", []string{"model"}, "Pushes refused by the version rules (stale, conflicting, fenced)."}
	fStoreReads      = Family{"rlhub_store_reads_total", "counter", []string{"model"}, "Versions handed or lent to readers (pulls, watch sends, in-process reads)."}
	fStoreReadBytes  = Family{"rlhub_store_read_bytes_total", "counter", []string{"model"}, "Bytes of the versions counted by rlhub_store_reads_total."}
	fSyncNewest      = Family{"rlhub_sync_newest_version", "gauge", []string{"model"}, "Newest version of each model weight sync has seen."}
	fSyncCollectors  = Family{"rlhub_sync_collectors", "gauge", []string{"model"}, "Collectors known (attached or reported recently) per model."}
	fSyncVersion     = Family{"rlhub_sync_collector_version", "gauge", []string{"model", "collector"}, "Version each collector reports running; the collectors past the cap share collector=\"other\" (their lowest version)."}
	fSyncLag         = Family{"rlhub_sync_collector_lag", "gauge", []string{"model", "collector"}, "Newest − running version per collector; collector=\"other\" holds the largest lag of those past the cap."}
	fSyncLagHist     = Family{"rlhub_sync_lag", "histogram", []string{"model"}, "Distribution of the collectors' lag now (versions behind), every collector counted."}
	fSyncStreams     = Family{"rlhub_sync_streams", "gauge", nil, "Push (Attach) streams open."}
	fSyncSent        = Family{"rlhub_sync_versions_sent_total", "counter", nil, "Whole versions sent on push streams."}
	fSyncSentBytes   = Family{"rlhub_sync_sent_bytes_total", "counter", nil, "Bytes of the versions sent on push streams."}
	fSyncReports     = Family{"rlhub_sync_reports_total", "counter", nil, "Collector version reports received."}
	fRelayRefused    = Family{"rlhub_relay_versions_refused_total", "counter", nil, "Upstream versions this relay could not take because they are over its --max-model-bytes; it keeps serving the version it has until a newer one fits."}
	fAggLearners     = Family{"rlhub_aggregator_learners", "gauge", nil, "Learners attached to the aggregator."}
	fAggAttached     = Family{"rlhub_aggregator_learners_attached_total", "counter", nil, "Learners that ever attached."}
	fAggRemoved      = Family{"rlhub_aggregator_learners_removed_total", "counter", nil, "Learners that left or whose lease lapsed."}
	fAggLearn        = Family{"rlhub_aggregator_learn_total", "counter", []string{"outcome"}, "Learn tasks by outcome (ok, failed)."}
	fAggResplits     = Family{"rlhub_aggregator_resplits_total", "counter", nil, "Shares re-split after a learner failed mid-task."}
	fAggLearnerTasks = Family{"rlhub_aggregator_learner_tasks_total", "counter", []string{"learner", "outcome"}, "Each attached learner's task shares by outcome; learners past the cap share learner=\"other\"."}
	fARSRuns         = Family{"rlhub_ars_runs", "gauge", []string{"state"}, "ARS runs on the hub by state (running, done)."}
	fARSWorkers      = Family{"rlhub_ars_workers", "gauge", nil, "ARS workers attached to the hub."}
	fARSReassigned   = Family{"rlhub_ars_tasks_reassigned_total", "counter", nil, "ARS task leases handed to another worker (expired lease, departed worker, straggler)."}
	fARSIteration    = Family{"rlhub_ars_iteration", "gauge", []string{"run", "env"}, "Finished iterations of each run (the newest runs up to the cap)."}
	fARSEval         = Family{"rlhub_ars_eval_return", "gauge", []string{"run", "env"}, "Mean return of the run's last evaluation."}
	fARSTrain        = Family{"rlhub_ars_train_return", "gauge", []string{"run", "env"}, "Mean shifted return of the last iteration's ±δ training episodes."}
	fARSEpisodes     = Family{"rlhub_ars_episodes_total", "counter", []string{"run", "env"}, "Training episodes of each run."}
	fARSSteps        = Family{"rlhub_ars_env_steps_total", "counter", []string{"run", "env"}, "Environment steps of each run (training and evaluation)."}
	fARSStepsRate    = Family{"rlhub_ars_env_steps_per_second", "gauge", []string{"run", "env"}, "Environment steps per second of hub time over each run so far."}
	fWorkerTasks     = Family{"rlhub_ars_worker_tasks_total", "counter", nil, "Tasks this ARS worker ran."}
	fWorkerSteps     = Family{"rlhub_ars_worker_env_steps_total", "counter", nil, "Environment steps this ARS worker took (rate() is its steps/s)."}
	fWorkerPulls     = Family{"rlhub_ars_worker_policy_pulls_total", "counter", nil, "Policies this ARS worker pulled (not inlined in a lease)."}
	fWorkerIteration = Family{"rlhub_ars_worker_iteration", "gauge", nil, "Iteration of the ARS worker's last lease."}
	fAuthTokens      = Family{"rlhub_auth_tokens", "gauge", nil, "Tokens loaded from the token file."}
	fAuthLive        = Family{"rlhub_auth_live_calls", "gauge", nil, "Calls in progress under a token (cut when it is revoked or expires)."}
	fAuthReloads     = Family{"rlhub_auth_reloads_total", "counter", []string{"outcome"}, "Token file reloads by outcome (ok, failed: the old tokens stayed)."}
	fAuthCut         = Family{"rlhub_auth_calls_cut_total", "counter", nil, "Calls ended because their token was revoked, changed or expired."}
	fAuthQuota       = Family{"rlhub_auth_quota_refusals_total", "counter", []string{"quota"}, "Pushes refused by a token's quota (models: max-models, bytes: max-bytes, rate: max-rps)."}
	fClusterMember   = Family{"rlhub_cluster_member", "gauge", nil, "1 while this hub is a member of the cluster, 0 while it joins (etcd not reached, its lease lost) or is out after a local fault."}
	fClusterFaults   = Family{"rlhub_cluster_faults_total", "counter", nil, "Times this hub left the cluster because it could not write its data (disk full, read-only, I/O error)."}
	fClusterPrimary  = Family{"rlhub_cluster_primary", "gauge", nil, "1 while this hub is the cluster's primary, 0 while it is a standby."}
	fClusterEpoch    = Family{"rlhub_cluster_epoch", "gauge", nil, "Epoch of the term this hub holds (primary) or follows (standby; 0: no primary known)."}
	fClusterUnit     = Family{"rlhub_cluster_replicated_unit", "gauge", nil, "Newest replication unit: applied here (standby) or asked for by a publish (primary); units number anew each term."}
	fClusterApplied  = Family{"rlhub_cluster_units_applied_total", "counter", nil, "Replication units this hub applied as a standby since it started."}
	fClusterSynced   = Family{"rlhub_cluster_synced", "gauge", nil, "1 while this standby holds a full copy of the primary it follows (it may campaign), else 0."}
	fClusterScrubs   = Family{"rlhub_cluster_scrubs_total", "counter", nil, "Checks of this hub's copy (each store version's and optimizer state's checksum) completed as a standby: on start and every --replica-scrub-every."}
	fClusterDamaged  = Family{"rlhub_cluster_damaged_files_total", "counter", nil, "Files of this hub's copy its scrubs found damaged and moved aside (DATA/.replica/damaged) for the primary to send again; any rise means the disk corrupts data."}
	fClusterShipped  = Family{"rlhub_cluster_shipped_bytes_total", "counter", []string{"how"}, "File bytes this hub sent to standbys while primary, each standby's counted, by how: whole (a file sent whole), append (only the bytes past a standby's copy of a file its writer appends to), cut (a standby's own cut: its full sync, or a unit after the snapshots it needed were gone)."}
	fClusterCuts     = Family{"rlhub_cluster_cuts_total", "counter", nil, "Units this hub sent to standbys from their own cuts while primary: one per full sync, and one per unit a standby took after the snapshots it needed were gone; a steady rise means a standby keeps falling behind."}
	fClusterInSync   = Family{"rlhub_cluster_in_sync_standbys", "gauge", nil, "On a primary with --replica-acks all: standbys the in-sync record lists, the only ones that may take over (0: none can; if this primary dies, no hub serves until it is back)."}
	fDPRequests      = Family{"rlhub_dataplane_requests_total", "counter", []string{"method", "code"}, "Data-plane requests answered, by method (unknown: a name no handler serves) and status code (named as rlhub_grpc_server_handled_total's grpc_code)."}
	fConnsRefused    = Family{"rlhub_conns_refused_total", "counter", []string{"reason"}, "Connections the hub's port closed for their client's fault: peer_cap (over --max-conns-per-peer, gRPC or data plane), handshake (first bytes, TLS handshake or data-plane hello invalid or not within --frame-timeout), frame_timeout (a data-plane request frame unfinished within --frame-timeout), malformed (a malformed data-plane request frame), body_timeout (a data-plane request body not received within --body-timeout + its length at --body-min-rate; answered DEADLINE_EXCEEDED), reply_timeout (a data-plane reply body not taken within the same bound; closed mid-body), unauthenticated (a data-plane hello without a token the hub knows; answered UNAUTHENTICATED in place of the magic)."}
	fGRPCCut         = Family{"rlhub_grpc_streams_cut_total", "counter", []string{"direction"}, "gRPC streams the hub (or rlhub relay) ended because a body missed its deadline (--body-timeout + its length at --body-min-rate): received (a push not sent in time; answered DEADLINE_EXCEEDED, nothing of it stored or applied) or sent (a pull, watch, weight, policy or optimizer-step stream whose client did not take a version in time; ended UNAVAILABLE, releasing the version it held)."}
	fClusterLag      = Family{"rlhub_cluster_standby_lag_units", "gauge", []string{"member"}, "On the primary: units asked for that each connected standby has not acknowledged yet."}
)

// grpcFamilies are the gRPC server metrics (go-grpc-middleware's
// providers/prometheus, namespace rlhub), present once an RPC was served.
var grpcFamilies = []Family{
	{"rlhub_grpc_server_started_total", "counter", []string{"grpc_type", "grpc_service", "grpc_method"}, "RPCs started on the server."},
	{"rlhub_grpc_server_handled_total", "counter", []string{"grpc_type", "grpc_service", "grpc_method", "grpc_code"}, "RPCs completed on the server, by status code."},
	{"rlhub_grpc_server_msg_received_total", "counter", []string{"grpc_type", "grpc_service", "grpc_method"}, "Stream messages received by the server."},
	{"rlhub_grpc_server_msg_sent_total", "counter", []string{"grpc_type", "grpc_service", "grpc_method"}, "Stream messages sent by the server."},
	{"rlhub_grpc_server_handling_seconds", "histogram", []string{"grpc_type", "grpc_service", "grpc_method"}, "Time to complete an RPC on the server."},
}

var (
	reducerFamilies    = []Family{fReducerPushed, fReducerReduced, fReducerApplied, fReducerDropped, fReducerLost, fReducerSteps, fReducerQueue, fReducerLatency, fReducerModelVer, fReducerModelApp, fReducerModelOpt}
	storeFamilies      = []Family{fStoreVersion, fStoreBytes, fStoreRetained, fStorePushes, fStoreRefused, fStoreReads, fStoreReadBytes}
	syncFamilies       = []Family{fSyncNewest, fSyncCollectors, fSyncVersion, fSyncLag, fSyncLagHist, fSyncStreams, fSyncSent, fSyncSentBytes, fSyncReports}
	relayFamilies      = []Family{fRelayRefused}
	aggregatorFamilies = []Family{fAggLearners, fAggAttached, fAggRemoved, fAggLearn, fAggResplits, fAggLearnerTasks}
	arsFamilies        = []Family{fARSRuns, fARSWorkers, fARSReassigned, fARSIteration, fARSEval, fARSTrain, fARSEpisodes, fARSSteps, fARSStepsRate}
	workerFamilies     = []Family{fWorkerTasks, fWorkerSteps, fWorkerPulls, fWorkerIteration}
	authFamilies       = []Family{fAuthTokens, fAuthLive, fAuthReloads, fAuthCut, fAuthQuota}
	dataPlaneFamilies  = []Family{fDPRequests, fConnsRefused}
	grpcBodyFamilies   = []Family{fGRPCCut}
	clusterFamilies    = []Family{fClusterMember, fClusterFaults, fClusterPrimary, fClusterEpoch, fClusterUnit, fClusterApplied, fClusterSynced, fClusterScrubs, fClusterDamaged, fClusterShipped, fClusterCuts, fClusterInSync, fClusterLag}
)

// Families lists every rlhub_* metric family this package can export, in
// the docs table's order.
func Families() []Family {
	var out []Family
	for _, g := range [][]Family{reducerFamilies, storeFamilies, syncFamilies, relayFamilies, aggregatorFamilies, arsFamilies, workerFamilies, authFamilies, dataPlaneFamilies, grpcBodyFamilies, clusterFamilies, grpcFamilies} {
		out = append(out, g...)
	}
	return out
}

func (f Family) desc() *prometheus.Desc { return prometheus.NewDesc(f.Name, f.Help, f.Labels, nil) }

func (f Family) valueType() prometheus.ValueType {
	if f.Type == "counter" {
		return prometheus.CounterValue
	}
	return prometheus.GaugeValue
}
