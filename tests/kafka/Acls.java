// Grants ACLs for the tests in one client: each line of standard input is
// "PRINCIPAL RESOURCE_TYPE NAME OPERATION" (e.g. "User:w TOPIC ces WRITE"; the
// name of a CLUSTER is kafka-cluster), allowed from any host, literal pattern.
//
// Usage: java -cp 'LIB/*:CLASSES' Acls BOOTSTRAP PROPS_FILE < lines

import java.io.BufferedReader;
import java.io.FileInputStream;
import java.io.InputStreamReader;
import java.nio.charset.StandardCharsets;
import java.util.ArrayList;
import java.util.List;
import java.util.Properties;
import java.util.concurrent.TimeUnit;
import org.apache.kafka.clients.admin.Admin;
import org.apache.kafka.clients.admin.AdminClientConfig;
import org.apache.kafka.common.acl.AccessControlEntry;
import org.apache.kafka.common.acl.AclBinding;
import org.apache.kafka.common.acl.AclOperation;
import org.apache.kafka.common.acl.AclPermissionType;
import org.apache.kafka.common.resource.PatternType;
import org.apache.kafka.common.resource.ResourcePattern;
import org.apache.kafka.common.resource.ResourceType;

public class Acls {
    public static void main(String[] args) throws Exception {
        Properties props = new Properties();
        try (FileInputStream in = new FileInputStream(args[1])) {
            props.load(in);
        }
        props.put(AdminClientConfig.BOOTSTRAP_SERVERS_CONFIG, args[0]);
        List<AclBinding> bindings = new ArrayList<>();
        BufferedReader lines = new BufferedReader(new InputStreamReader(System.in, StandardCharsets.UTF_8));
        for (String line; (line = lines.readLine()) != null; ) {
            line = line.trim();
            if (line.isEmpty()) {
                continue;
            }
            String[] f = line.split("\\s+");
            bindings.add(new AclBinding(
                new ResourcePattern(ResourceType.valueOf(f[1]), f[2], PatternType.LITERAL),
                new AccessControlEntry(f[0], "*", AclOperation.valueOf(f[3]), AclPermissionType.ALLOW)));
        }
        try (Admin admin = Admin.create(props)) {
            admin.createAcls(bindings).all().get(60, TimeUnit.SECONDS);
        }
        System.out.println("created " + bindings.size() + " ACLs");
    }
}
