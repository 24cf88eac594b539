// Kafka admin operations that confluent-kafka (librdkafka) has no call for, for connectors/kafka/cluster.py.
//
// Compiled once by cluster.py (javac, against the embedded broker's classpath) and run as
// `java -cp <classes>:<broker jars> ClusterTool <command> ...`. Each command prints JSON lines on stdout;
// a failure prints its cause on stderr and exits 1.
//
//   quota <bootstrap> <clients|users> <name|-> <key>=<value>|<key>= ...
//       Admin.alterClientQuotas on one entity ("-": the default entity); "<key>=" removes the key.
//   quotas <bootstrap>
//       Admin.describeClientQuotas, every entity: {"entity": {...}, "quotas": {...}} per line.
//   reassign <bootstrap> <topic> <partition>=<id>,<id>... ...
//       Admin.alterPartitionReassignments (the first id is the preferred leader).
//   reassigning <bootstrap>
//       Admin.listPartitionReassignments: one line per partition being reassigned.
//   watch-fetch <interval_ms> <node>=<pid> ...
//       Attach to each broker JVM (its local JMX agent), then every interval print one line per client of
//       the brokers' Fetch quota metrics (kafka.server:type=Fetch,user=...,client-id=...): throttle-time
//       (the average delay, ms, the broker imposed in the quota window) and byte-rate. Ends when stdin
//       closes.

import com.fasterxml.jackson.databind.ObjectMapper;
import com.sun.tools.attach.VirtualMachine;
import java.util.ArrayList;
import java.util.HashMap;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;
import java.util.Optional;
import java.util.Properties;
import java.util.concurrent.TimeUnit;
import javax.management.Attribute;
import javax.management.MBeanServerConnection;
import javax.management.ObjectName;
import javax.management.remote.JMXConnectorFactory;
import javax.management.remote.JMXServiceURL;
import org.apache.kafka.clients.admin.Admin;
import org.apache.kafka.clients.admin.AdminClientConfig;
import org.apache.kafka.clients.admin.NewPartitionReassignment;
import org.apache.kafka.clients.admin.PartitionReassignment;
import org.apache.kafka.common.TopicPartition;
import org.apache.kafka.common.quota.ClientQuotaAlteration;
import org.apache.kafka.common.quota.ClientQuotaEntity;
import org.apache.kafka.common.quota.ClientQuotaFilter;

public final class ClusterTool {
    private static final ObjectMapper JSON = new ObjectMapper();
    private static final long TIMEOUT_S = 60;

    public static void main(String[] args) throws Exception {
        if (args.length < 2) {
            usage();
        }
        try {
            switch (args[0]) {
                case "quota" -> quota(args);
                case "quotas" -> quotas(args[1]);
                case "reassign" -> reassign(args);
                case "reassigning" -> reassigning(args[1]);
                case "watch-fetch" -> watchFetch(args);
                default -> usage();
            }
        } catch (Exception e) {
            Throwable cause = e.getCause() != null ? e.getCause() : e;
            System.err.println(args[0] + " failed: " + cause);
            System.exit(1);
        }
        System.exit(0);
    }

    private static void usage() {
        System.err.println("usage: ClusterTool quota|quotas|reassign|reassigning|watch-fetch ...");
        System.exit(2);
    }

    private static Admin admin(String bootstrap) {
        Properties props = new Properties();
        props.put(AdminClientConfig.BOOTSTRAP_SERVERS_CONFIG, bootstrap);
        props.put(AdminClientConfig.DEFAULT_API_TIMEOUT_MS_CONFIG, "60000");
        return Admin.create(props);
    }

    private static void print(Map<String, Object> line) throws Exception {
        System.out.println(JSON.writeValueAsString(line));
        System.out.flush();
    }

    private static void quota(String[] args) throws Exception {
        if (args.length < 5) {
            usage();
        }
        String type = switch (args[2]) {
            case "clients" -> ClientQuotaEntity.CLIENT_ID;
            case "users" -> ClientQuotaEntity.USER;
            default -> throw new IllegalArgumentException("entity type must be clients or users: " + args[2]);
        };
        Map<String, String> entity = new HashMap<>();
        entity.put(type, "-".equals(args[3]) ? null : args[3]);  // null: the default entity
        List<ClientQuotaAlteration.Op> ops = new ArrayList<>();
        for (int i = 4; i < args.length; i++) {
            String[] kv = args[i].split("=", 2);
            ops.add(new ClientQuotaAlteration.Op(kv[0], kv.length < 2 || kv[1].isEmpty()
                    ? null : Double.valueOf(kv[1])));
        }
        try (Admin admin = admin(args[1])) {
            admin.alterClientQuotas(List.of(new ClientQuotaAlteration(new ClientQuotaEntity(entity), ops)))
                    .all().get(TIMEOUT_S, TimeUnit.SECONDS);
        }
    }

    private static void quotas(String bootstrap) throws Exception {
        try (Admin admin = admin(bootstrap)) {
            var all = admin.describeClientQuotas(ClientQuotaFilter.all()).entities()
                    .get(TIMEOUT_S, TimeUnit.SECONDS);
            for (var e : all.entrySet()) {
                Map<String, Object> line = new LinkedHashMap<>();
                line.put("entity", e.getKey().entries());
                line.put("quotas", e.getValue());
                print(line);
            }
        }
    }

    private static void reassign(String[] args) throws Exception {
        if (args.length < 4) {
            usage();
        }
        String topic = args[2];
        Map<TopicPartition, Optional<NewPartitionReassignment>> moves = new LinkedHashMap<>();
        for (int i = 3; i < args.length; i++) {
            String[] pr = args[i].split("=", 2);
            List<Integer> replicas = new ArrayList<>();
            for (String id : pr[1].split(",")) {
                replicas.add(Integer.valueOf(id.trim()));
            }
            moves.put(new TopicPartition(topic, Integer.parseInt(pr[0])),
                      Optional.of(new NewPartitionReassignment(replicas)));
        }
        try (Admin admin = admin(args[1])) {
            admin.alterPartitionReassignments(moves).all().get(TIMEOUT_S, TimeUnit.SECONDS);
        }
    }

    private static void reassigning(String bootstrap) throws Exception {
        try (Admin admin = admin(bootstrap)) {
            Map<TopicPartition, PartitionReassignment> ongoing = admin.listPartitionReassignments()
                    .reassignments().get(TIMEOUT_S, TimeUnit.SECONDS);
            for (var e : ongoing.entrySet()) {
                Map<String, Object> line = new LinkedHashMap<>();
                line.put("topic", e.getKey().topic());
                line.put("partition", e.getKey().partition());
                line.put("replicas", e.getValue().replicas());
                line.put("adding", e.getValue().addingReplicas());
                line.put("removing", e.getValue().removingReplicas());
                print(line);
            }
        }
    }

    private static double number(Object value) {
        double v = value instanceof Number n ? n.doubleValue() : 0.0;
        return Double.isFinite(v) ? v : 0.0;  // an Avg with no sample in its window is NaN
    }

    private static void watchFetch(String[] args) throws Exception {
        long interval = Long.parseLong(args[1]);
        Map<String, MBeanServerConnection> brokers = new LinkedHashMap<>();
        for (int i = 2; i < args.length; i++) {
            String[] np = args[i].split("=", 2);
            VirtualMachine vm = VirtualMachine.attach(np[1]);
            String url;
            try {
                url = vm.startLocalManagementAgent();
            } finally {
                vm.detach();
            }
            brokers.put(np[0], JMXConnectorFactory.connect(new JMXServiceURL(url)).getMBeanServerConnection());
        }
        Thread stdin = new Thread(() -> {
            try {
                while (System.in.read() >= 0) {
                    // the caller closes stdin to stop the watch
                }
            } catch (java.io.IOException ignored) {
                // closed
            }
            System.exit(0);
        });
        stdin.setDaemon(true);
        stdin.start();
        ObjectName pattern = new ObjectName("kafka.server:type=Fetch,*");
        Map<String, Object> ready = new LinkedHashMap<>();
        ready.put("ready", brokers.keySet());
        print(ready);
        while (true) {
            for (var b : brokers.entrySet()) {
                for (ObjectName name : b.getValue().queryNames(pattern, null)) {
                    Map<String, Object> line = new LinkedHashMap<>();
                    line.put("node", Integer.parseInt(b.getKey()));
                    line.put("client_id", unquote(name.getKeyProperty("client-id")));
                    line.put("user", unquote(name.getKeyProperty("user")));
                    for (Object a : b.getValue().getAttributes(name, new String[] {"throttle-time", "byte-rate"})
                            .asList()) {
                        Attribute attr = (Attribute) a;
                        line.put(attr.getName().replace('-', '_'), number(attr.getValue()));
                    }
                    print(line);
                }
            }
            Thread.sleep(interval);
        }
    }

    private static String unquote(String value) {
        return value == null ? "" : (value.startsWith("\"") ? ObjectName.unquote(value) : value);
    }
}
