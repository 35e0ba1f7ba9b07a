-- A second copy of `A customer-support desk of a software company`: the same schema, values redrawn (sqltasks.transfer.redraw).
CREATE TABLE Organizations (OrganizationId INTEGER PRIMARY KEY, Name VARCHAR NOT NULL, Plan VARCHAR NOT NULL, Country VARCHAR NOT NULL, CreatedAt DATE NOT NULL);
CREATE TABLE Agents (AgentId INTEGER PRIMARY KEY, FullName VARCHAR NOT NULL, Email VARCHAR NOT NULL, TeamLeadId INTEGER REFERENCES Agents(AgentId), HiredOn DATE NOT NULL, IsActive BOOLEAN NOT NULL);
CREATE TABLE Customers (CustomerId INTEGER PRIMARY KEY, OrganizationId INTEGER NOT NULL REFERENCES Organizations(OrganizationId), FullName VARCHAR NOT NULL, Email VARCHAR NOT NULL, IsVip BOOLEAN NOT NULL);
CREATE TABLE Tickets (TicketId INTEGER PRIMARY KEY, CustomerId INTEGER NOT NULL REFERENCES Customers(CustomerId), AssigneeId INTEGER REFERENCES Agents(AgentId), Subject VARCHAR NOT NULL, Priority VARCHAR NOT NULL, Status VARCHAR NOT NULL, Channel VARCHAR NOT NULL, OpenedAt DATE NOT NULL, ClosedAt DATE);
CREATE TABLE Tags (TagId INTEGER PRIMARY KEY, Label VARCHAR NOT NULL);
CREATE TABLE TicketTags (TicketId INTEGER NOT NULL REFERENCES Tickets(TicketId), TagId INTEGER NOT NULL REFERENCES Tags(TagId), PRIMARY KEY (TicketId, TagId));
CREATE TABLE Comments (CommentId INTEGER PRIMARY KEY, TicketId INTEGER NOT NULL REFERENCES Tickets(TicketId), AgentId INTEGER REFERENCES Agents(AgentId), Body VARCHAR NOT NULL, IsPublic BOOLEAN NOT NULL, PostedAt DATE NOT NULL);
CREATE TABLE SatisfactionRatings (RatingId INTEGER PRIMARY KEY, TicketId INTEGER NOT NULL REFERENCES Tickets(TicketId), Score INTEGER NOT NULL, LeftOn DATE NOT NULL);
INSERT INTO "Organizations" ("OrganizationId", "Name", "Plan", "Country", "CreatedAt") VALUES
  (1, 'Brightloop', 'free', 'Canada', DATE '2021-03-14'),
  (2, 'Quillstack', 'free', 'Canada', DATE '2022-02-28'),
  (3, 'Harbor Analytics', 'team', 'Ireland', DATE '2023-05-15'),
  (4, 'Nimbus Print', 'team', 'Canada', DATE '2020-08-21'),
  (5, 'Tealeaf Health', 'free', 'Ireland', DATE '2022-09-30'),
  (6, 'Copperfield Legal', 'enterprise', 'Canada', DATE '2024-01-04'),
  (7, 'Tealeaf Health 7', 'team', 'Canada', DATE '2022-08-21');
INSERT INTO "Agents" ("AgentId", "FullName", "Email", "TeamLeadId", "HiredOn", "IsActive") VALUES (1, 'Marta Lindgren', 'marta@support.example', NULL, DATE '2019-04-08', TRUE);
INSERT INTO "Agents" ("AgentId", "FullName", "Email", "TeamLeadId", "HiredOn", "IsActive") VALUES (2, 'Kofi Boateng', 'kofi@support.example', 1, DATE '2020-09-15', TRUE);
INSERT INTO "Agents" ("AgentId", "FullName", "Email", "TeamLeadId", "HiredOn", "IsActive") VALUES (3, 'Sana Qureshi', 'sana@support.example', 1, DATE '2021-02-01', TRUE);
INSERT INTO "Agents" ("AgentId", "FullName", "Email", "TeamLeadId", "HiredOn", "IsActive") VALUES (4, 'Diego Ferreira', 'diego@support.example', NULL, DATE '2019-09-07', FALSE);
INSERT INTO "Agents" ("AgentId", "FullName", "Email", "TeamLeadId", "HiredOn", "IsActive") VALUES (5, 'Ivy Chen', 'ivy@support.example', 4, DATE '2022-05-09', FALSE);
INSERT INTO "Agents" ("AgentId", "FullName", "Email", "TeamLeadId", "HiredOn", "IsActive") VALUES (6, 'Tomas Novak', 'tomas@support.example', 4, DATE '2023-01-16', TRUE);
INSERT INTO "Agents" ("AgentId", "FullName", "Email", "TeamLeadId", "HiredOn", "IsActive") VALUES (7, 'Aiko Mori', 'aiko@support.example', 4, DATE '2023-08-12', FALSE);
INSERT INTO "Agents" ("AgentId", "FullName", "Email", "TeamLeadId", "HiredOn", "IsActive") VALUES (8, 'Tomas Novak 8', 'tomas@support.example 8', 4, DATE '2023-01-16', FALSE);
INSERT INTO "Customers" ("CustomerId", "OrganizationId", "FullName", "Email", "IsVip") VALUES
  (1, 3, 'Helena Fischer', 'helena@brightloop.example', FALSE),
  (2, 5, 'Jonas Weber', 'jonas@brightloop.example', TRUE),
  (3, 1, 'Priya Raman', 'priya@quillstack.example', FALSE),
  (4, 2, 'Owen Clarke', 'owen@quillstack.example', FALSE),
  (5, 4, 'Niamh Byrne', 'niamh@harbor.example', FALSE),
  (6, 5, 'Lukas Braun', 'lukas@nimbus.example', TRUE),
  (7, 5, 'Grace Tan', 'grace@tealeaf.example', TRUE),
  (8, 3, 'Ravi Patel', 'ravi@tealeaf.example', FALSE),
  (9, 6, 'Emily Watson', 'emily@tealeaf.example', FALSE),
  (10, 5, 'Marc Tremblay', 'marc@copperfield.example', FALSE),
  (11, 2, 'Ada Moreau', 'ada@harbor.example', TRUE),
  (12, 4, 'Felix Wagner', 'felix@nimbus.example', FALSE),
  (13, 1, 'Felix Wagner 13', 'felix@nimbus.example 13', FALSE),
  (14, 4, 'Ravi Patel 14', 'ravi@tealeaf.example 14', FALSE);
INSERT INTO "Tickets" ("TicketId", "CustomerId", "AssigneeId", "Subject", "Priority", "Status", "Channel", "OpenedAt", "ClosedAt") VALUES
  (101, 9, 2, 'Cannot export invoices to CSV', 'urgent', 'open', 'web', DATE '2024-01-08', DATE '2024-01-10'),
  (102, 5, 3, 'SSO login loops back to start', 'low', 'solved', 'phone', DATE '2023-12-16', DATE '2023-12-16'),
  (103, 4, 2, 'Question about seat pricing', 'low', 'closed', 'chat', DATE '2024-03-25', DATE '2024-03-28'),
  (104, 3, 3, 'Webhook retries failing', 'high', 'open', 'web', DATE '2024-05-04', NULL),
  (105, 8, 7, 'Add a second admin', 'high', 'closed', 'web', DATE '2024-04-16', DATE '2024-04-17'),
  (106, 7, NULL, 'Dark mode request', 'low', 'open', 'web', DATE '2023-12-13', NULL),
  (107, 1, 5, 'Password reset email never arrives', 'urgent', 'open', 'web', DATE '2024-02-06', DATE '2024-02-08'),
  (108, 5, 2, 'Printer integration times out', 'normal', 'solved', 'phone', DATE '2024-04-03', DATE '2024-04-12'),
  (109, 4, 5, 'Data residency in Australia', 'low', 'open', 'web', DATE '2024-04-18', NULL),
  (110, 3, 2, 'Audit log missing entries', 'urgent', 'pending', 'chat', DATE '2024-07-17', NULL),
  (111, 10, 7, 'Bulk import of patients fails', 'normal', 'solved', 'web', DATE '2024-05-14', DATE '2024-05-20'),
  (112, 1, 6, 'Change billing contact', 'high', 'closed', 'web', DATE '2024-05-27', DATE '2024-05-28'),
  (113, 7, NULL, 'Is there a discount for charities?', 'low', 'closed', 'chat', DATE '2024-06-03', NULL),
  (114, 9, 2, 'API rate limit too low', 'low', 'closed', 'email', DATE '2024-03-28', DATE '2024-04-01'),
  (115, 1, 3, 'Invoice shows wrong VAT number', 'urgent', 'solved', 'email', DATE '2024-08-29', DATE '2024-09-01'),
  (116, 2, 6, 'Two-factor codes rejected', 'high', 'solved', 'email', DATE '2024-07-01', DATE '2024-07-01'),
  (117, 8, 5, 'Webhook signature mismatch', 'urgent', 'solved', 'chat', DATE '2024-05-22', DATE '2024-05-28'),
  (118, 2, NULL, 'Export reports as PDF', 'high', 'solved', 'chat', DATE '2024-07-22', NULL),
  (119, 6, 5, 'Change billing contact 119', 'low', 'solved', 'email', DATE '2024-05-27', DATE '2024-05-28'),
  (120, 2, 7, 'Password reset email never arrives 120', 'high', 'solved', 'phone', DATE '2024-03-20', DATE '2024-03-22'),
  (121, 4, 3, 'Question about seat pricing 121', 'low', 'solved', 'phone', DATE '2024-02-02', DATE '2024-02-05'),
  (122, 9, 3, 'Add a second admin 122', 'high', 'solved', 'chat', DATE '2024-05-03', DATE '2024-05-04');
INSERT INTO "Tags" ("TagId", "Label") VALUES
  (1, 'billing'),
  (2, 'authentication'),
  (3, 'integrations'),
  (4, 'feature-request'),
  (5, 'bug'),
  (6, 'compliance'),
  (7, 'onboarding'),
  (8, 'authentication 8');
INSERT INTO "TicketTags" ("TicketId", "TagId") VALUES
  (101, 1),
  (101, 5),
  (102, 2),
  (102, 5),
  (103, 1),
  (104, 3),
  (104, 5),
  (105, 2),
  (106, 4),
  (107, 2),
  (107, 5),
  (108, 3),
  (109, 6),
  (110, 6),
  (110, 5),
  (111, 3),
  (112, 1),
  (113, 1),
  (114, 3),
  (114, 4),
  (115, 1),
  (115, 5),
  (116, 2),
  (117, 3),
  (118, 4);
INSERT INTO "Comments" ("CommentId", "TicketId", "AgentId", "Body", "IsPublic", "PostedAt") VALUES
  (1, 104, NULL, 'The export button does nothing.', TRUE, DATE '2024-01-27'),
  (2, 110, 4, 'Fixed in today''s release, please retry.', TRUE, DATE '2024-04-06'),
  (3, 111, 5, 'Escalated to the identity team.', TRUE, DATE '2024-01-15'),
  (4, 104, 3, 'Your IdP certificate had expired; renewed.', TRUE, DATE '2024-03-31'),
  (5, 104, 5, 'We can reproduce the failed retries.', FALSE, DATE '2024-02-20'),
  (6, 114, NULL, 'Any update on this?', FALSE, DATE '2024-03-04'),
  (7, 107, 1, 'Your mail server rejected our sender.', FALSE, DATE '2024-03-21'),
  (8, 116, 6, 'Asked the vendor for logs.', FALSE, DATE '2024-06-22'),
  (9, 109, 3, 'Legal review requested.', TRUE, DATE '2024-01-25'),
  (10, 109, 6, 'Approved to share our DPA.', TRUE, DATE '2024-01-26'),
  (11, 102, NULL, 'Entries from May 1 are missing.', FALSE, DATE '2024-05-06'),
  (12, 108, 2, 'The CSV had a BOM; import works without it.', TRUE, DATE '2024-05-03'),
  (13, 101, 7, 'Limit raised to 600 requests per minute.', TRUE, DATE '2024-06-28'),
  (14, 115, 3, 'Corrected the VAT number on the account.', TRUE, DATE '2024-07-19'),
  (15, 104, 6, 'Clock drift on the device; resynced.', TRUE, DATE '2024-07-01'),
  (16, 117, 5, 'Secret was rotated; signatures match now.', TRUE, DATE '2024-07-15'),
  (17, 101, 2, 'Adding this to the integration guide.', FALSE, DATE '2024-07-07'),
  (18, 117, 7, 'We can reproduce the failed retries. 18', TRUE, DATE '2024-01-08'),
  (19, 116, 7, 'We can reproduce the failed retries. 19', TRUE, DATE '2024-02-20'),
  (20, 102, 5, 'Clock drift on the device; resynced. 20', TRUE, DATE '2024-07-01');
INSERT INTO "SatisfactionRatings" ("RatingId", "TicketId", "Score", "LeftOn") VALUES
  (1, 101, 3, DATE '2024-01-11'),
  (2, 116, 3, DATE '2024-03-05'),
  (3, 103, 5, DATE '2024-02-06'),
  (4, 115, 2, DATE '2024-03-03'),
  (5, 105, 5, DATE '2024-02-02'),
  (6, 102, 2, DATE '2024-04-13'),
  (7, 101, 5, DATE '2024-05-21'),
  (8, 111, 2, DATE '2024-03-01'),
  (10, 117, 5, DATE '2024-03-30'),
  (11, 107, 4, DATE '2024-06-02'),
  (12, 108, 4, DATE '2024-07-16'),
  (13, 112, 4, DATE '2023-10-17'),
  (14, 103, 3, DATE '2024-03-24');
